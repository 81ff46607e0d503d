"""Fixtures of the vLLM plugin tests (run only inside .venv-vllm: `make vllm-test`; the main suite never
collects this folder, see norecursedirs in pyproject.toml)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROFILE = REPO / "profiles" / "smollm2-135m-instruct.json"
ENV = {
    "OMP_NUM_THREADS": "2",
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


@pytest.fixture(scope="session")
def model_folder() -> Path:
    """The converted SmolLM2-135M-Instruct folder that `duocal models fetch` caches (fetched by `make vllm-test`)."""
    from duocal_runtime.files.cache_root import default_cache_dir

    folder = default_cache_dir() / "models" / "smollm2-135m-instruct"
    assert (folder / "config.json").is_file(), f"{folder} missing: run `duocal models fetch smollm2-135m-instruct`"
    return folder


@pytest.fixture(scope="session")
def reference() -> dict:
    return json.loads((HERE / "data" / "reference_tokens.json").read_text())


def duo_overrides(profile=PROFILE, **settings) -> dict:
    return {"architectures": ["DuoLlamaForCausalLM"], "duocal_profile": str(profile), **settings}


def run_vllm(model_folder: Path, prompts, hf_overrides=None, max_tokens=16, env=None, **extra):
    """(tokens per prompt or None, the run's output text). `extra`: more engine settings (run_vllm.py)."""
    result, text = run_vllm_result(model_folder, prompts, hf_overrides, max_tokens, env, **extra)
    return (result["tokens"] if result else None), text


def run_vllm_result(model_folder: Path, prompts, hf_overrides=None, max_tokens=16, env=None, **extra):
    """({"tokens": ..., "cached": ...} or None, the run's output text)."""
    spec = {"model": str(model_folder), "prompts": prompts, "max_tokens": max_tokens, "hf_overrides": hf_overrides}
    spec.update(extra)
    done = subprocess.run(
        [sys.executable, str(HERE / "run_vllm.py"), json.dumps({**spec})],
        capture_output=True,
        text=True,
        env={**os.environ, **ENV, **(env or {})},
        timeout=900,
    )
    text = done.stdout + done.stderr
    found = re.search(r"^RESULT (.*)$", done.stdout, re.M)
    return (json.loads(found.group(1)) if found else None), text


def kv_cache_tokens(text: str) -> int:
    return int(re.search(r"KV cache size: ([\d,]+) tokens", text).group(1).replace(",", ""))

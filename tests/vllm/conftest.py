"""Fixtures of the vLLM plugin tests (run only inside .venv-vllm: `make vllm-test`; the main suite never
collects this folder, see norecursedirs in pyproject.toml).

An engine start takes 20-120 s on this machine, so each engine configuration starts once per session: every
offline engine in one subprocess (`offline`, run_vllm.py), and one `duocal serve --engine vllm` server
(test_serve_vllm.py). SmolLM2-135M-Instruct, float32, max length 2048, 512 batched tokens, 1 GiB of KV."""

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from duocal_runtime.profile.shape import ModelShape

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROFILE = REPO / "profiles" / "smollm2-135m-instruct.json"
ENV = {
    "OMP_NUM_THREADS": "2",
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "PYTHONUNBUFFERED": "1",
}
SMOLLM2 = dict(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64, hidden_size=576)
MAX_NUM_BATCHED_TOKENS = 512  # the server's too: the stock engine's KV size is the server's ratio line's baseline


@dataclass(frozen=True)
class EngineRun:
    """One offline engine of run_vllm.py: its greedy tokens per prompt and the prompt tokens each read from the
    prefix cache (both None when building the engine raised: `refused`), and its part of the log."""

    tokens: list[list[int]] | None
    cached: list[int] | None
    kernel_calls: list[int] | None  # calls of vLLM's CPU attention kernel, per prompt
    refused: bool
    log: str


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


def profile_of_another_model(folder: Path) -> Path:
    """The shipped profile claiming a 28-layer model (SmolLM2 has 30)."""
    data = json.loads(PROFILE.read_text())
    data["model"].update(num_hidden_layers=28, fingerprint=ModelShape(28, 9, 3, 64).fingerprint, name_or_path="another")
    data["scores"] = data["scores"][:28]
    data.pop("measurements", None)
    wrong = folder / "wrong.json"
    wrong.write_text(json.dumps(data))
    return wrong


def offline_engines(reference: dict, wrong_profile: Path) -> list[dict]:
    """Every offline engine configuration of the tests (run_vllm.py's engine keys), each started once."""
    prompts = [case["prompt_ids"] for case in reference["cases"]]
    long_prompt = reference["cases"][2]["prompt_ids"]
    small = {f"DUOCAL_{k.upper()}": str(v) for k, v in reference["small"].items()}
    return [
        {"name": "stock", "prompts": prompts},
        # the long prompt again last: with prefix caching on, its second run reads the first one's blocks
        {"name": "all_full", "prompts": [*prompts, long_prompt], "enable_prefix_caching": True,
         "hf_overrides": duo_overrides(duocal_sparsity=0)},
        # the plan from the environment only: every head sink_window, sink 32 + recent 128 (eviction changes answers)
        {"name": "small_window", "prompts": prompts, "hf_overrides": {"architectures": ["DuoLlamaForCausalLM"]},
         "env": {"DUOCAL_PROFILE": str(PROFILE), "DUOCAL_SPARSITY": "1.0", **small}},
        # the shipped profile at 0.75 (23 full + 67 streaming heads after group fitting): its kernel calls per step
        {"name": "shipped_075", "prompts": prompts[:1], "max_tokens": 8, "block_size": 64,
         "hf_overrides": duo_overrides(duocal_sparsity=0.75)},
        {"name": "wrong_profile", "prompts": [[1, 2, 3]], "hf_overrides": duo_overrides(wrong_profile)},
        {"name": "h2o", "prompts": [[1, 2, 3]],
         "hf_overrides": duo_overrides(duocal_sparsity=0.5, duocal_policy="h2o")},
    ]  # fmt: skip


@pytest.fixture(scope="session")
def offline(model_folder, reference, tmp_path_factory) -> dict[str, EngineRun]:
    """Runs every offline engine once, in one subprocess: {name: EngineRun}."""
    engines = offline_engines(reference, profile_of_another_model(tmp_path_factory.mktemp("profiles")))
    return run_engines(model_folder, engines)


def run_engines(model_folder: Path, engines: list[dict], env: dict | None = None) -> dict[str, EngineRun]:
    """Runs the engines (run_vllm.py's engine keys) one after another in one subprocess: {name: EngineRun}."""
    done = subprocess.run(
        [sys.executable, str(HERE / "run_vllm.py"), json.dumps({"model": str(model_folder), "engines": engines})],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **ENV, **(env or {})},
        timeout=1200,
    )
    runs = engine_runs(done.stdout)
    assert set(runs) == {engine["name"] for engine in engines}, done.stdout[-4000:]
    return runs


def run_vllm(model_folder: Path, prompts, hf_overrides=None, max_tokens=16, env=None, **settings):
    """(tokens per prompt or None, the log) of one engine in its own subprocess: a start of its own, so prefer a
    configuration in `offline_engines`. `settings`: more run_vllm.py engine keys (block_size, ...)."""
    engine = {"name": "one", "prompts": prompts, "max_tokens": max_tokens, "hf_overrides": hf_overrides, **settings}
    run = run_engines(model_folder, [engine], env)["one"]
    return run.tokens, run.log


def engine_runs(text: str) -> dict[str, EngineRun]:
    """run_vllm.py's output cut at its ``ENGINE name`` lines, each part read for its RESULT line."""
    runs = {}
    for part in re.split(r"^(?=ENGINE \S+$)", text, flags=re.M)[1:]:
        name = part.split(None, 2)[1]
        found = re.search(rf"^RESULT {re.escape(name)} (.*)$", part, re.M)
        refused = re.search(rf"^REFUSED {re.escape(name)}$", part, re.M) is not None
        assert found or refused, f"engine {name} neither answered nor was refused:\n{part[-4000:]}"
        result = json.loads(found.group(1)) if found else {"tokens": None, "cached": None, "kernel_calls": None}
        runs[name] = EngineRun(result["tokens"], result["cached"], result["kernel_calls"], refused, part)
    return runs


def kv_cache_tokens(text: str) -> int:
    return int(re.search(r"KV cache size: ([\d,]+) tokens", text).group(1).replace(",", ""))

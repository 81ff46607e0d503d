"""Constants and runners of the vLLM plugin's tests (tests/vllm/, run only inside .venv-vllm: `make vllm-test`):
vLLM engines started in a subprocess (tests/vllm/run_vllm.py) and what their logs say."""

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from duocal_runtime.profile.shape import ModelShape

from helpers.paths import REPO

HERE = REPO / "tests" / "vllm"
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

"""Fixtures of the vLLM plugin tests (run only inside .venv-vllm: `make vllm-test`; the main suite never
collects this folder, see norecursedirs in pyproject.toml).

An engine start takes 20-120 s on this machine, so each engine configuration starts once per session: every
offline engine in one subprocess (`offline`, run_vllm.py), and one `duocal serve --engine vllm` server
(test_serve_vllm.py). SmolLM2-135M-Instruct, float32, max length 2048, 512 batched tokens, 1 GiB of KV."""

import json
from pathlib import Path

import pytest

from duocal.serving.vllm_launch import SHARED_PREFIX_SCHEDULER

# re-exported for test files that still import them from here; new tests import helpers.vllm_engines
from helpers.vllm_engines import (  # noqa: F401
    ENV,
    HERE,
    MAX_NUM_BATCHED_TOKENS,
    PROFILE,
    REPO,
    SMOLLM2,
    EngineRun,
    duo_overrides,
    engine_runs,
    kv_cache_tokens,
    profile_of_another_model,
    run_engines,
    run_vllm,
)


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
        # the shipped profile at 0.5 with every block hashed (as duocal serve sets it): the long prompt again, and a
        # question about its first 700 tokens, read the cache with their own sinks
        {"name": "shipped_05_cached", "prompts": [*prompts, long_prompt, questions(prompts)[0]],
         "enable_prefix_caching": True, "prefix_cache_retention_interval": None, "block_size": 64,
         "hf_overrides": duo_overrides(duocal_sparsity=0.5)},
        # four questions about that document sent together, under duocal serve's chunk cap and scheduler
        {"name": "shipped_05_together", "prompts": questions(prompts), "together": True, "enable_prefix_caching": True,
         "prefix_cache_retention_interval": None, "block_size": 64, "max_num_batched_tokens": 2048,
         "long_prefill_token_threshold": 512, "scheduler_cls": SHARED_PREFIX_SCHEDULER,
         "hf_overrides": duo_overrides(duocal_sparsity=0.5)},
        {"name": "shipped_05_uncached", "prompts": questions(prompts), "block_size": 64,
         "hf_overrides": duo_overrides(duocal_sparsity=0.5)},
        # the plan from the environment only: every head sink_window, sink 32 + recent 128 (eviction changes answers)
        {"name": "small_sink_window", "prompts": prompts, "hf_overrides": {"architectures": ["DuoLlamaForCausalLM"]},
         "env": {"DUOCAL_PROFILE": str(PROFILE), "DUOCAL_SPARSITY": "1.0", **small}},
        # the shipped profile at 0.75 (23 full + 67 streaming heads after group fitting): its kernel calls per step
        {"name": "shipped_075", "prompts": prompts[:1], "max_tokens": 8, "block_size": 64,
         "hf_overrides": duo_overrides(duocal_sparsity=0.75)},
        {"name": "wrong_profile", "prompts": [[1, 2, 3]], "hf_overrides": duo_overrides(wrong_profile)},
        {"name": "h2o", "prompts": [[1, 2, 3]],
         "hf_overrides": duo_overrides(duocal_sparsity=0.5, duocal_policy="h2o")},
    ]  # fmt: skip


def questions(prompts: list[list[int]]) -> list[list[int]]:
    """Four prompts sharing the long prompt's first 700 tokens (a document), each then 100 tokens of its own."""
    return [prompts[2][:700] + prompts[3][100 * i : 100 * (i + 1)] for i in range(4)]


@pytest.fixture(scope="session")
def offline(model_folder, reference, tmp_path_factory) -> dict[str, EngineRun]:
    """Runs every offline engine once, in one subprocess: {name: EngineRun}."""
    engines = offline_engines(reference, profile_of_another_model(tmp_path_factory.mktemp("profiles")))
    return run_engines(model_folder, engines)

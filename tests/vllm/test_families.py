"""Every family the plugin runs, on a small random-weight model of each (make_family_models.py, written with the main
venv's transformers and duocal runtime): Llama with Llama-3 rope scaling, Mistral, Qwen2 (q/k/v biases), Qwen3
(per-head q/k norms); 4 layers of 4 KV heads, fp32, block size 32, prompts inside, across and past sink + window.

- an all-full plan gives stock vLLM's tokens and KV size;
- the plan of a random profile (sink 32 + recent 64, at 0.5 or 0.75) gives duocal's runtime tokens, in one kernel
  call per layer and policy (cache_layout.py's count, split segments included), with more KV tokens than stock;
- the same plan with the profile's scores reversed (the other heads stream: the policies swapped) does not: the
  mutation the token test must catch. Qwen2's plan runs compiled (vLLM's default), the others eager.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

from duocal_vllm.cache_layout import cache_layout

from helpers.vllm_engines import HERE, REPO, kv_cache_tokens, run_engines

COMPILED = {"qwen2"}
DUO = {"llama": "DuoLlamaForCausalLM", "mistral": "DuoMistralForCausalLM", "qwen2": "DuoQwen2ForCausalLM",
       "qwen3": "DuoQwen3ForCausalLM"}  # fmt: skip
GROUP_FIT = "streaming KV heads run full"  # the plugin's log line when it changes the plan (it must not here)


@pytest.fixture(scope="session")
def families(tmp_path_factory) -> tuple[Path, dict]:
    """The model folders, profiles and reference tokens, made by the main venv (DUOCAL_MAIN_PYTHON)."""
    out = tmp_path_factory.mktemp("families")
    python = os.environ.get("DUOCAL_MAIN_PYTHON", str(REPO / ".venv" / "bin" / "python"))
    made = subprocess.run([python, str(HERE / "make_family_models.py"), str(out)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)  # fmt: skip
    assert made.returncode == 0, made.stderr[-3000:]
    return out, json.loads((out / "reference.json").read_text())


def engines_of(out: Path, reference: dict, family: str) -> list[dict]:
    case = reference["families"][family]
    common = dict(model=str(out / family), prompts=reference["prompts"], max_tokens=len(case["duo"][0]),
                  max_model_len=2048, block_size=32)  # fmt: skip

    def duo(profile: str, **settings) -> dict:
        return {"architectures": [DUO[family]], "duocal_profile": str(out / profile), **settings}

    plan = dict(duocal_sparsity=case["sparsity"], duocal_sink=reference["sink"], duocal_recent=reference["recent"])
    return [
        {"name": f"{family}-stock", **common},
        {"name": f"{family}-full", "hf_overrides": duo(f"{family}.profile.json", duocal_sparsity=0), **common},
        {"name": f"{family}-duo", "hf_overrides": duo(f"{family}.profile.json", **plan),
         "enforce_eager": family not in COMPILED, **common},
        {"name": f"{family}-inverse", "hf_overrides": duo(f"{family}.inverse.profile.json", **plan), **common},
    ]  # fmt: skip


@pytest.fixture(scope="session")
def family_runs(families) -> dict:
    out, reference = families
    engines = [engine for family in DUO for engine in engines_of(out, reference, family)]
    return run_engines(out, engines)


@pytest.mark.parametrize("family", DUO)
def test_an_all_full_plan_is_stock_vllm(family_runs, family):
    stock, full = family_runs[f"{family}-stock"], family_runs[f"{family}-full"]
    assert stock.tokens is not None and full.tokens is not None, (stock.log + full.log)[-4000:]
    assert full.tokens == stock.tokens
    assert kv_cache_tokens(full.log) == kv_cache_tokens(stock.log)
    assert full.kernel_calls == stock.kernel_calls


@pytest.mark.parametrize("family", DUO)
def test_a_mixed_plan_gives_duocal_runtime_tokens_in_one_call_per_layer_and_policy(families, family_runs, family):
    _, reference = families
    case, run, stock = reference["families"][family], family_runs[f"{family}-duo"], family_runs[f"{family}-stock"]
    assert run.tokens is not None, run.log[-4000:]
    assert GROUP_FIT not in run.log
    assert case["full"] != case["duo"]  # eviction changes these answers: the test can tell plans apart
    assert run.tokens == case["duo"]
    assert kv_cache_tokens(run.log) > kv_cache_tokens(stock.log)
    steps = len(case["duo"][0])  # one prefill chunk and one step per further token, one prompt at a time
    layers = len(case["streaming"])
    assert stock.kernel_calls == [steps * layers] * len(reference["prompts"])  # the count itself is right
    calls = sum(cache_layout([["s" if s else "f" for s in row] for row in case["streaming"]]).calls_per_layer)
    assert run.kernel_calls == [steps * calls] * len(reference["prompts"])
    assert calls <= 2 * layers or family == "llama"  # llama's 0.75: segments of 4, 3, 3, 2 in three groups of 4


@pytest.mark.parametrize("family", DUO)
def test_the_plan_with_policies_swapped_does_not(families, family_runs, family):
    _, reference = families
    run = family_runs[f"{family}-inverse"]
    assert run.tokens is not None, run.log[-4000:]
    assert run.tokens != reference["families"][family]["duo"]

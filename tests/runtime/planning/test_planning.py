import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import duocal_runtime as dr
from duocal_runtime.planning.head_order import bounded_order

from helpers.policy_matrix import policy_matrix
from helpers.profiles import random_profile


def upstream_full_mask(scores: np.ndarray, sparsity: float) -> np.ndarray:
    """duo_attn/utils.py sparsify_attention_heads, without its tie-breaking noise."""
    threshold = np.quantile(scores, sparsity)
    if sparsity >= 1:
        threshold = 2
    if sparsity <= 0:
        threshold = -1
    return scores >= threshold


def full_mask(plan: dr.Plan) -> np.ndarray:
    return np.array([[isinstance(p, dr.Full) for p in row] for row in plan.policies])


@pytest.mark.parametrize("layers, kv_heads", [(32, 8), (32, 32), (16, 4)])
@pytest.mark.parametrize("sparsity", [0.0, 0.25, 0.5, 0.75, 1.0])
@pytest.mark.parametrize("seed", range(3))
def test_matches_upstream_quantile_rule_without_ties(layers, kv_heads, sparsity, seed):
    profile = random_profile(layers=layers, kv_heads=kv_heads, heads=kv_heads, seed=seed)
    scores = np.array(profile.scores)
    assert len(np.unique(scores)) == scores.size
    plan = dr.plan(profile, sparsity=sparsity)
    np.testing.assert_array_equal(full_mask(plan), upstream_full_mask(scores, sparsity))


@pytest.mark.parametrize("sparsity", [0.1, 0.33, 0.5, 0.6, 0.9])
def test_exact_count_and_deterministic_with_ties(sparsity):
    profile = random_profile(layers=8, kv_heads=4, ties=True)
    heads = 32
    plans = [dr.plan(profile, sparsity=sparsity) for _ in range(3)]
    assert all(p.num_bounded == round(sparsity * heads) for p in plans)
    assert plans[0] == plans[1] == plans[2]
    assert plans[0].sparsity == pytest.approx(round(sparsity * heads) / heads)


def test_streaming_order_breaks_ties_by_later_head_first():
    assert bounded_order([0.5, 0.1, 0.5, 0.5]) == [1, 3, 2, 0]


def test_streaming_heads_never_score_above_full_heads():
    profile = random_profile(layers=8, kv_heads=4, ties=True, seed=5)
    plan = dr.plan(profile, sparsity=0.5)
    mask = full_mask(plan)
    scores = np.array(profile.scores)
    assert scores[~mask].max() <= scores[mask].min()


def test_threshold_keeps_scores_at_or_above():
    profile = random_profile(layers=4, kv_heads=4, seed=1)
    plan = dr.plan(profile, threshold=0.5)
    np.testing.assert_array_equal(full_mask(plan), np.array(profile.scores) >= 0.5)


def test_only_one_selector():
    with pytest.raises(dr.PlanError, match="one of sparsity, threshold or budget"):
        dr.plan(random_profile(), sparsity=0.5, threshold=0.3)


def test_memory_report_is_analytic():
    profile = random_profile(layers=4, kv_heads=2, heads=4, head_dim=8)
    plan = dr.plan(profile, sparsity=0.5, sink=4, recent=12)
    report = plan.memory_report(context=100, batch=3, dtype="float32")
    assert report["kv_tokens_full"] == 3 * 8 * 100
    assert report["kv_tokens_plan"] == 3 * (4 * 100 + 4 * 16)
    assert report["kv_bytes_plan"] == report["kv_tokens_plan"] * 2 * 8 * 4
    assert plan.retrieval_heads_per_layer and sum(plan.retrieval_heads_per_layer) == 4
    short = plan.memory_report(context=10)
    assert short["kv_bytes_plan"] == short["kv_bytes_full"]  # short contexts keep everything


def test_budget_picks_fewest_streaming_heads_that_fit():
    profile = random_profile(layers=4, kv_heads=4, heads=4, head_dim=8, seed=2)
    context = 1000
    for k in range(1, 17):
        budget_tokens = 16 * context - k * (context - 320)  # exactly k sink_window(64, 256) heads
        plan = dr.plan(profile, budget=budget_tokens, context=context, sink=64, recent=256)
        assert plan.num_bounded == k
        assert plan.kv_tokens(context) <= budget_tokens
        if k < 16:
            tighter = dr.plan(profile, budget=budget_tokens - 1, context=context, sink=64, recent=256)
            assert tighter.num_bounded == k + 1
        assert plan == dr.plan(profile, sparsity=k / 16, sink=64, recent=256)


def test_budget_in_bytes_and_errors():
    profile = random_profile(layers=4, kv_heads=4, heads=4, head_dim=8)
    plan = dr.plan(profile, budget="300KiB", context=1000, dtype="bfloat16")
    assert plan.kv_bytes(1000, dtype="bfloat16") <= 300 * 1024
    assert 0 < plan.num_bounded < 16
    with pytest.raises(dr.PlanError, match="impossible budget"):
        dr.plan(profile, budget="1KiB", context=1000)
    with pytest.raises(dr.PlanError, match="context"):
        dr.plan(profile, budget="1GiB")
    with pytest.raises(dr.PlanError, match="cannot read budget"):
        dr.plan(profile, budget="lots", context=10)


@pytest.mark.parametrize("policy", policy_matrix(bits=16, fields=("recent",)))
def test_policy_and_sizes(policy):
    plan = dr.plan(random_profile(), sparsity=1.0, policy=policy.name, sink=2, recent=3, heavy=5)
    kinds = {p for row in plan.policies for p in row}
    assert len(kinds) == 1
    (p,) = kinds
    assert p.name == policy.name and p.recent == 3


@pytest.mark.parametrize("sizes", [dict(sink=0), dict(recent=-1), dict(heavy=0)])
def test_bad_sizes(sizes):
    with pytest.raises(dr.PlanError, match="positive integer"):
        dr.plan(random_profile(), sparsity=0.5, policy="sink_h2o", **sizes)


def test_unknown_policy_and_full_refused():
    with pytest.raises(dr.PlanError, match="unknown policy"):
        dr.plan(random_profile(), policy="lru")
    with pytest.raises(dr.PlanError, match="cannot be 'full'"):
        dr.plan(random_profile(), policy="full")


def test_plan_dict_round_trip_and_groups():
    plan = dr.plan(random_profile(layers=3, kv_heads=4, heads=8), sparsity=0.5, policy="h2o")
    assert dr.Plan.from_dict(plan.to_dict()) == plan
    for layer in range(3):
        heads = sorted(h for _, hs in plan.layer_groups(layer) for h in hs)
        assert heads == [0, 1, 2, 3]


@settings(max_examples=60, deadline=None)
@given(
    scores=st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]) | st.floats(0, 1), min_size=4, max_size=4 * 3),
    sparsity=st.floats(0, 1),
)
def test_property_exact_count_and_nested_selections(scores, sparsity):
    kv_heads = 4 if len(scores) % 4 == 0 else 1
    layers = len(scores) // kv_heads
    shape = dr.ModelShape(layers, kv_heads, kv_heads, 8)
    rows = [scores[i * kv_heads : (i + 1) * kv_heads] for i in range(layers)]
    profile = dr.Profile(dr.ModelInfo(shape), rows)
    plan = dr.plan(profile, sparsity=sparsity)
    assert plan.num_bounded == round(sparsity * len(scores))
    bigger = dr.plan(profile, sparsity=min(1.0, sparsity + 0.25))
    assert (full_mask(bigger) <= full_mask(plan)).all()  # more sparsity only ever adds streaming heads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_byte_budget_means_the_bytes_the_applied_cache_holds(dtype):
    """SmolLM2 in fp32 filled ~120 MiB for a 60 MiB plan made in bf16: the plan's dtype must be the model's."""
    from helpers.models import left_padded_batch, tiny_model

    model = tiny_model("llama", dtype=dtype)
    profile = random_profile(layers=2, kv_heads=2, heads=4, head_dim=16)
    budget, context = "40KiB", 200
    plan = dr.plan(profile, budget=budget, context=context, dtype=model.dtype, sink=4, recent=12)
    assert plan.budget_dtype == str(dtype).removeprefix("torch.")
    ids, mask = left_padded_batch([context])
    with dr.apply(model, plan) as runtime:
        cache = runtime.new_cache()
        model(input_ids=ids, attention_mask=mask, cache=cache)
    assert cache.kv_bytes() == plan.kv_bytes(context, 1, model.dtype) <= 40 * 1024
    other = torch.bfloat16 if dtype == torch.float32 else torch.float32
    mismatched = dr.plan(profile, budget=budget, context=context, dtype=other, sink=4, recent=12)
    with pytest.raises(dr.PlanError, match=r"fills its byte budget in .*make the plan with dtype=model.dtype"):
        dr.apply(model, mismatched)
    assert dr.Plan.from_dict(plan.to_dict()).budget_dtype == plan.budget_dtype


def test_plans_profiles_and_runtimes_print_on_one_screen(tiny_llama):

    profile = random_profile(layers=30, kv_heads=3, heads=9, head_dim=64)
    plan = dr.plan(profile, sparsity=0.5)
    for text in (repr(plan), repr(profile)):
        assert len(text) < 200 and "\n" not in text
    assert "full 45" in repr(plan) and "sink_window(sink=64, recent=256) 45" in repr(plan)
    assert plan.summary(context=2048).count("\n") == 3 and "2048 tokens" in plan.summary(context=2048)
    assert profile.summary().count("\n") == 3
    model = tiny_llama
    with dr.apply(model, dr.uniform_plan(dr.shape_of_config(model.config), dr.Full())) as runtime:
        assert repr(runtime).startswith("Runtime(applied to LlamaForCausalLM, Plan(")
    assert repr(runtime).startswith("Runtime(removed")


def test_max_context_reads_a_plain_number_as_bytes_and_refuses_tokens():
    plan = dr.plan(random_profile(), sparsity=0.5)
    assert plan.max_context(72_000_000_000) == plan.max_context("72GB") > 0
    with pytest.raises(dr.PlanError, match="memory must be bytes"):
        plan.max_context("2000000 tokens")
    with pytest.raises(dr.PlanError):
        plan.max_context(0)

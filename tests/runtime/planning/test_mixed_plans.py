"""Mixed plans under a budget: within the budget, locally optimal, deterministic, clear when
impossible, and run under generate() exactly like the dense per-head reference."""

import itertools
import random

import pytest
import torch

import duocal_runtime as dr
from duocal_runtime.planning.mixed import predicted_losses
from duocal_runtime.profile.measurements import Measurement, kept_name

from helpers.models import left_padded_batch
from helpers.reference_attention import NAME, DenseReference

POLICIES = ("full", "sink_window", "h2o")


def measured_profile(layers=6, kv_heads=4, seed=0, sizes=None) -> dr.Profile:
    rng = random.Random(seed)
    shape = dr.ModelShape(layers, kv_heads * 2, kv_heads, 16)
    base = dr.Profile(
        dr.ModelInfo(shape, "test/model"), [[rng.random() for _ in range(kv_heads)] for _ in range(layers)]
    )
    deploy = dr.DeployDefaults.of(dr.SinkWindow(4, 28), dr.H2O(16, 16))
    measurements = {}
    for policy in (dr.SinkWindow(4, 28), dr.H2O(16, 16)):
        table = [[rng.random() for _ in range(kv_heads)] for _ in range(layers)]
        settings = {"policy": (sizes or policy).to_dict() if sizes and policy.name == sizes.name else policy.to_dict()}
        measurements[kept_name(policy.name)] = Measurement(table, settings)
    return dr.Profile(base.model, base.scores, {"kind": "profiler"}, deploy, measurements)


def head_costs(plan: dr.Plan, context: int) -> int:
    return plan.kv_bytes(context, 1, "bfloat16")


@pytest.mark.parametrize("fraction", [0.2, 0.35, 0.5, 0.8])
def test_the_mix_fits_and_no_single_head_change_could_do_better(fraction):
    profile, context = measured_profile(), 512
    full = dr.plan(profile, sparsity=0).kv_bytes(context)
    budget = int(full * fraction)
    plan = dr.plan(profile, budget=f"{budget}B", context=context, policies=POLICIES)
    assert plan.kv_bytes(context) <= budget
    policies = [dr.make_policy(p, sink=4, recent=28, heavy=16) for p in POLICIES]
    policies[2] = dr.H2O(16, 16)
    losses = predicted_losses(profile, policies)
    cost = [p.tokens_kept(context) * 2 * 16 * 2 for p in policies]
    choice = [policies.index(p) for row in plan.policies for p in row]
    spent = sum(cost[c] for c in choice)
    total = sum(losses[h][c] for h, c in enumerate(choice))
    for h, p in itertools.product(range(len(choice)), range(len(policies))):
        if spent - cost[choice[h]] + cost[p] <= budget:
            assert losses[h][p] >= losses[h][choice[h]] - 1e-12, f"head {h} -> {policies[p].name} fits and loses less"
    assert plan.choice["predicted_loss"] == pytest.approx(total, abs=1e-5)
    assert sum(plan.choice["policy_counts"].values()) == profile.shape.num_kv_heads_total


def test_deterministic_and_budget_monotone():
    profile, context = measured_profile(seed=3), 512
    full = dr.plan(profile, sparsity=0).kv_bytes(context)
    plans = [dr.plan(profile, budget=f"{int(full * f)}B", context=context, policies=POLICIES) for f in (0.3, 0.3, 0.6)]
    assert plans[0] == plans[1]
    assert plans[2].choice["predicted_loss"] <= plans[0].choice["predicted_loss"]
    assert plans[2].choice["policy_counts"]["full"] >= plans[0].choice["policy_counts"]["full"]


def test_impossible_budgets_and_bad_arguments_are_clear():
    profile = measured_profile()
    with pytest.raises(dr.PlanError, match="impossible budget: even every head on its cheapest policy"):
        dr.plan(profile, budget="10KiB", context=4096, policies=POLICIES)
    with pytest.raises(dr.PlanError, match="pass budget= and context="):
        dr.plan(profile, sparsity=0.5, policies=POLICIES)
    with pytest.raises(dr.PlanError, match="needs the context length"):
        dr.plan(profile, budget="1MiB", policies=POLICIES)
    with pytest.raises(dr.PlanError, match="unknown policy 'fast'"):
        dr.plan(profile, budget="1MiB", context=512, policies=("full", "fast"))


def test_measurements_at_other_sizes_fall_back_to_the_score_order():
    profile = measured_profile(sizes=dr.SinkWindow(8, 56))  # measured at another window than the plan uses
    losses = predicted_losses(profile, [dr.Full(), dr.SinkWindow(4, 28), dr.H2O(16, 16)])
    assert [row[1] for row in losses] == profile.flat_scores()
    assert [row[2] for row in losses] == [1 - k for k in profile.measurements["kept:h2o"].flat()]


def test_mixed_plan_under_generate_with_padding_matches_the_dense_reference(tiny_llama):
    model = tiny_llama
    shape = dr.shape_of_config(model.config)
    rng = random.Random(1)
    deploy = dr.DeployDefaults.of(dr.SinkWindow(2, 5), dr.H2O(3, 4))
    table = lambda: [[rng.random() for _ in range(2)] for _ in range(2)]  # noqa: E731
    profile = dr.Profile(
        dr.ModelInfo(shape, "tiny"),
        table(),
        {},
        deploy,
        {
            "kept:sink_window": Measurement(table(), {"policy": dr.SinkWindow(2, 5).to_dict()}),
            "kept:h2o": Measurement(table(), {"policy": dr.H2O(3, 4).to_dict()}),
        },
    )
    plan = dr.plan(profile, budget=2 * 7 + 7 + 40, context=40, policies=POLICIES)
    assert plan.choice["policy_counts"]["full"] == 1 and sum(n > 0 for n in plan.choice["policy_counts"].values()) >= 2
    ids, mask = left_padded_batch([30, 21])
    kwargs = dict(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=10,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with DenseReference(plan):
        model.set_attn_implementation(NAME)
        want = model.generate(**kwargs)
        model.set_attn_implementation("sdpa")
    with dr.apply(model, plan) as runtime:
        got = model.generate(**kwargs, cache=runtime.new_cache())
    torch.testing.assert_close(torch.stack(got.logits), torch.stack(want.logits), rtol=0, atol=1e-4)
    assert torch.equal(got.sequences, want.sequences)

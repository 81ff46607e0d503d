"""Bits as a choice per head: the profiler's measured output error of KIVI codes, and mixed plans
that give each full head 16, 8 or 4 bits by it under a byte budget."""

import random

import pytest
import torch
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.cli.app import app
from duocal.profiling.quantization_error import output_error
from duocal_runtime.attention.dense import decode_sdpa
from duocal_runtime.profile.measurements import Measurement, error_name, kept_name
from duocal_runtime.quant import attention as QA
from duocal_runtime.quant import codes as Q

from helpers.models import left_padded_batch

MIX = ("full", "full-kv8", "full-kv4", "sink_window")


def test_output_error_is_the_relative_error_of_attention_over_the_quantized_cache():
    """Checked against the runtime's own blocked attention over codes (another code path)."""
    torch.manual_seed(0)
    groups, rep, d, t = 2, 3, 16, 120
    k, v = torch.randn(groups, t, d), torch.randn(groups, t, d)
    rows = [90, 119]
    queries = torch.randn(groups * rep, len(rows), d)
    policy = dr.Full(kv_bits=4, group=16, residual=20)
    got = output_error(queries, k, v, rows, 0.25, policy)
    want = []
    for a, row in enumerate(rows):
        n = row + 1
        quantized = Q.quantized_tokens(n, 16, 20)
        history = (Q.quantize_keys(k[None, :, :quantized], 4, 16), Q.quantize_values(v[None, :, :quantized], 4, 16))
        q = queries[None, :, a : a + 1]
        approx = QA.quantized_attention(
            q, history, k[None, :, quantized:n], v[None, :, quantized:n], (None, None), 0.25, 4, 16
        )
        exact = decode_sdpa(q, k[None, :, :n], v[None, :, :n], None, 0.25)
        want.append(((approx - exact).norm(dim=-1) / exact.norm(dim=-1))[0, :, 0].view(groups, rep).mean(-1))
    torch.testing.assert_close(got, torch.stack(want).mean(0), rtol=1e-4, atol=1e-6)
    eight = output_error(queries, k, v, rows, 0.25, dr.Full(kv_bits=8, group=16, residual=20))
    assert (eight < got).all() and (eight > 0).all()
    unquantized = output_error(queries, k, v, rows, 0.25, dr.Full(kv_bits=4, group=16, residual=128))
    assert torch.equal(unquantized, torch.zeros(groups))  # fewer tokens than the residual: nothing quantized


def profile_with_errors(layers=4, kv_heads=2, seed=0, group=8, bits=(8, 4)) -> dr.Profile:
    """A measured profile whose heads differ in how much codes hurt them (head_dim 8)."""
    rng = random.Random(seed)
    shape = dr.ModelShape(layers, kv_heads * 2, kv_heads, 8)
    sink_window = dr.SinkWindow(4, 12)
    table = lambda scale: [[scale * rng.random() for _ in range(kv_heads)] for _ in range(layers)]  # noqa: E731
    measurements = {kept_name("sink_window"): Measurement(table(1.0), {"policy": sink_window.to_dict()})}
    for b in bits:
        policy = dr.Full(kv_bits=b, group=group)
        measurements[error_name(policy.label)] = Measurement(
            table(0.02 if b == 8 else 0.2), {"policy": policy.to_dict()}
        )
    info = dr.ModelInfo(shape, "test/model", None, "LlamaForCausalLM")
    return dr.Profile(info, table(1.0), {"kind": "profiler"}, dr.DeployDefaults.of(sink_window), measurements)


def losses_by_label(profile, plan) -> float:
    total = 0.0
    for layer, row in enumerate(plan.policies):
        for head, p in enumerate(row):
            if p.bounded:
                total += 1 - profile.measurements[kept_name(p.name)].scores[layer][head]
            elif p.quantized:
                total += profile.measurements[error_name(p.label)].scores[layer][head]
    return total


@pytest.mark.parametrize("fraction", [0.15, 0.3, 0.6, 1.0])
def test_a_byte_budget_mixes_widths_by_measured_error_and_fits(fraction):
    profile, context = profile_with_errors(), 4096
    full_bytes = dr.plan(profile, sparsity=0).kv_bytes(context)
    budget = int(full_bytes * fraction)
    plan = dr.plan(profile, budget=f"{budget}B", context=context, policies=MIX)
    assert plan.kv_bytes(context) <= budget
    assert plan.choice["predicted_loss"] == pytest.approx(losses_by_label(profile, plan), abs=1e-5)
    counts = plan.choice["policy_counts"]
    assert set(counts) == set(MIX) and sum(counts.values()) == profile.shape.num_kv_heads_total
    if fraction == 1.0:
        assert counts["full"] == profile.shape.num_kv_heads_total  # everything fits in 16 bits: no loss
    if fraction == 0.3:  # below 16-bit full heads' bytes, above streaming's: codes beat eviction here
        assert counts["full-kv8"] + counts["full-kv4"] > 0
    assert plan == dr.plan(profile, budget=f"{budget}B", context=context, policies=MIX)  # deterministic


def test_the_head_codes_hurt_least_is_the_one_quantized():
    profile = profile_with_errors(layers=1, kv_heads=2)
    errors = profile.measurements[error_name("full-kv4")]
    low = min(range(2), key=lambda h: errors.scores[0][h])
    one_full = dr.Full().kv_bytes(4096, 8, 2)
    budget = one_full + dr.Full(kv_bits=4, group=8).kv_bytes(4096, 8, 2)
    plan = dr.plan(profile, budget=f"{budget}B", context=4096, policies=("full", "full-kv4"))
    assert plan.policies[0][low].label == "full-kv4" and plan.policies[0][1 - low].label == "full"


def test_mixing_widths_without_the_measurement_or_by_tokens_is_refused():
    profile = profile_with_errors(bits=(8,))
    with pytest.raises(dr.PlanError, match=r"error:full-kv4 .*no such measurement.*--kv-bits 4"):
        dr.plan(profile, budget="1MB", context=4096, policies=MIX)
    with pytest.raises(dr.PlanError, match="one at"):  # measured at another group
        dr.plan(profile, budget="1MB", context=4096, policies=("full", "full-kv8"), kv_group=4)
    with pytest.raises(dr.PlanError, match="budget in tokens cannot tell full from full-kv8"):
        dr.plan(profile, budget=1000, context=4096, policies=("full", "full-kv8", "sink_window"))
    with pytest.raises(dr.PlanError, match="distinct"):
        dr.plan(profile, budget="1MB", context=4096, policies=("full-kv8", "full-kv8"))
    with pytest.raises(dr.PlanError, match="kv_bits must be one of"):
        dr.plan(profile, budget="1MB", context=4096, policies=("full", "full-kv3"))


def test_a_plan_of_three_widths_and_a_sink_window_generates_in_dynamic_and_static_caches(tiny_llama):
    model = tiny_llama
    shape = dr.shape_of_config(model.config)
    policies = [dr.Full(), dr.Full(kv_bits=8, group=8, residual=8), dr.Full(kv_bits=4, group=8, residual=8)]
    plan = dr.Plan(shape, [policies[:2], [policies[2], dr.SinkWindow(3, 5)]])
    ids, mask = left_padded_batch([30, 19])
    with dr.apply(model, plan) as runtime:
        outs = [
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, cache=cache)
            for cache in (runtime.new_cache(), runtime.new_cache(max_length=48))
        ]
    assert torch.equal(outs[0], outs[1])


def test_profiles_show_reports_a_width_mix(tmp_path):
    path = tmp_path / "measured.json"
    dr.save_profile(profile_with_errors(), path)
    result = CliRunner().invoke(
        app, ["profiles", "show", str(path), "--budget", "600KB", "--context", "4096", "--policies", ",".join(MIX)]
    )
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("KV heads per policy:")]
    assert "full-kv8" in line  # a third of 16-bit bytes fit no head in 16 bits, and eviction loses more
    refused = CliRunner().invoke(app, ["profile", "--kv-bits", "3", "--output", str(tmp_path / "x.json")])
    assert refused.exit_code != 0 and "kv_bits must be distinct widths among 8 and 4" in refused.output

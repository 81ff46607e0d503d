"""KIVI-quantized full heads: codes within half a step, bytes as counted, attention as over the dequantized cache."""

import pytest
import torch

import duocal_runtime as dr
from duocal_runtime.policies import full_quantized
from duocal_runtime.policies.base import Step
from duocal_runtime.policies.full_quantized import QuantizedFullGroup
from duocal_runtime.quant import attention as QA
from duocal_runtime.quant import codes as Q

from helpers.models import drive_decode, left_padded_batch, padded_decode_steps
from helpers.policy_matrix import policy_matrix
from helpers.profiles import random_profile


def steps_of(q: Q.QuantizedKV, group: int, keys: bool) -> torch.Tensor:
    """Each element's quantization step (scale) broadcast to the tensor's shape."""
    if keys:
        return q.scale.float().repeat_interleave(group, dim=2)
    return q.scale.float().repeat_interleave(group, dim=3)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("keys", [True, False], ids=["keys", "values"])
def test_round_trip_is_within_half_a_step(bits, keys):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 64, 32) * torch.linspace(0.1, 8, 32)  # outlier channels, as keys have
    quantize, dequantize = (Q.quantize_keys, Q.dequantize_keys) if keys else (Q.quantize_values, Q.dequantize_values)
    q = quantize(x, bits, 16)
    back = dequantize(q, bits, 16, torch.float32)
    error = (back - x).abs()
    assert (error <= steps_of(q, 16, keys) / 2 + 1e-5).all()
    assert error.max() > 0  # it really is quantized
    assert q.codes.shape[-1] == 32 * bits // 8  # two 4-bit codes per byte


def test_padded_slots_stay_out_of_key_scales():
    torch.manual_seed(1)
    k = torch.randn(1, 2, 32, 8)
    valid = torch.ones(1, 32, dtype=torch.bool)
    valid[0, :5] = False
    k[:, :, :5] = 1000.0  # padding's keys: whatever the model made of the pad token
    q = Q.quantize_keys(k, 4, 16, valid)
    real_only = Q.quantize_keys(k[:, :, 16:], 4, 16)
    torch.testing.assert_close(q.scale[:, :, 1:], real_only.scale)
    back = Q.dequantize_keys(q, 4, 16, torch.float32)
    real = valid[0]
    assert ((back - k).abs()[:, :, real] <= steps_of(q, 16, True)[:, :, real] / 2 + 1e-5).all()


def test_bytes_are_codes_scales_zeros_and_the_residual():
    torch.manual_seed(2)
    d, group, residual, n = 32, 16, 24, 100
    held = Q.quantized_tokens(n, group, residual)
    assert held == 64 and residual <= n - held < residual + group
    for bits in (8, 4):
        k, v = (Q.quantize_keys, Q.quantize_values)
        x = torch.randn(1, 1, held, d, dtype=torch.bfloat16)
        stored = k(x, bits, group).nbytes + v(x, bits, group).nbytes  # scales and zeros in the cache's dtype
        stored += 2 * (n - held) * d * 2  # the bf16 residual, keys and values
        assert Q.quantized_bytes(n, d, bits, group, residual, 2) == stored
    assert Q.quantized_bytes(n, d, 16, group, residual, 2) == 2 * n * d * 2


def reference_attention(q, keys, values, visible, scaling):
    """q [B, H, T, D], keys/values [B, G, S, D], visible [B, 1, T, S] -> [B, H, T, D]."""
    rep = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
    scores = (q @ keys.transpose(-1, -2) * scaling).masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, -1) @ values


def test_blocked_attention_equals_attention_over_the_dequantized_cache(monkeypatch):
    monkeypatch.setattr(QA, "QUANTIZED_BLOCK", 32)  # three blocks of history, the last one short
    torch.manual_seed(3)
    b, g, r, d, n, m, t = 2, 2, 3, 16, 80, 20, 4
    k_hist, v_hist = torch.randn(b, g, n, d), torch.randn(b, g, n, d)
    history = (Q.quantize_keys(k_hist, 4, 16), Q.quantize_values(v_hist, 4, 16))
    rk, rv, q = torch.randn(b, g, m, d), torch.randn(b, g, m, d), torch.randn(b, g * r, t, d)
    hist_mask = torch.ones(b, 1, 1, n, dtype=torch.bool)
    hist_mask[1, ..., :7] = False  # row 1 is left padded
    causal = torch.arange(m)[None, :] <= (m - t + torch.arange(t))[:, None]
    out = QA.quantized_attention(q, history, rk, rv, (hist_mask, causal[None, None]), 0.25, 4, 16)
    keys = torch.cat((Q.dequantize_keys(history[0], 4, 16, torch.float32), rk), 2)
    values = torch.cat((Q.dequantize_values(history[1], 4, 16, torch.float32), rv), 2)
    visible = torch.cat((hist_mask.expand(b, 1, t, n), causal[None, None].expand(b, 1, t, m)), -1)
    torch.testing.assert_close(out, reference_attention(q, keys, values, visible, 0.25), rtol=0, atol=1e-5)


@pytest.mark.parametrize("query_block", [128, 5], ids=["one-query-block", "query-blocks"])
def test_group_attends_as_the_reference_across_prefill_chunks_and_decode_steps(monkeypatch, query_block):
    """Every pass sees the history quantized by the passes before it and its own tokens in full precision."""
    monkeypatch.setattr(full_quantized, "QUERY_BLOCK", query_block)
    torch.manual_seed(4)
    policy = dr.Full(kv_bits=4, group=8, residual=10)
    group = QuantizedFullGroup(policy, [0, 1], 2)
    b, g, d, scaling = 2, 2, 16, 0.25
    pad = torch.ones(b, 60, dtype=torch.bool)
    pad[1, :3] = False  # row 1 is left padded by 3
    all_k, all_v = torch.randn(b, g, 60, d), torch.randn(b, g, 60, d)
    seen, real = 0, torch.zeros(b, dtype=torch.long)
    for t in (20, 13, 1, 1, 1, 8, 1, 1):
        q, k, v = torch.randn(b, g * 2, t, d), all_k[:, :, seen : seen + t], all_v[:, :, seen : seen + t]
        quantized = Q.quantized_tokens(seen, 8, 10)  # what the passes before this one moved into codes
        keys, values = all_k[:, :, : seen + t].clone(), all_v[:, :, : seen + t].clone()
        if quantized:
            valid = pad[:, :quantized]
            keys[:, :, :quantized] = Q.dequantize_keys(
                Q.quantize_keys(keys[:, :, :quantized], 4, 8, valid), 4, 8, torch.float32
            )
            values[:, :, :quantized] = Q.dequantize_values(
                Q.quantize_values(values[:, :, :quantized], 4, 8), 4, 8, torch.float32
            )
        causal = torch.arange(seen + t)[None, :] <= (seen + torch.arange(t))[:, None]
        visible = causal[None, None] & pad[:, None, None, : seen + t]
        step = Step.make(seen, real, t, pad[:, : seen + t], scaling)
        out = group.attend(q, k, v, step)
        want = reference_attention(q, keys, values, visible, scaling)
        torch.testing.assert_close(out[1, :, -1], want[1, :, -1], rtol=0, atol=1e-5)
        torch.testing.assert_close(out[0], want[0], rtol=0, atol=1e-5)
        seen, real = seen + t, step.real_after
        assert group.quantized == Q.quantized_tokens(seen, 8, 10) and group.length == seen
    assert group.quantized == 32 and group.k.shape[2] == seen - 32


def forced_logits(model, plan, ids, mask, steps=12):
    """Logits of a prefill and `steps` decode steps fed the same tokens whatever the plan (no divergence)."""
    tokens, new_mask = padded_decode_steps(steps, padded=())
    with dr.apply(model, plan) as runtime:
        cache = runtime.new_cache()
        return drive_decode(model, ids, mask, cache, tokens, new_mask), cache


def test_quantized_decode_stays_close_to_16_bit_and_holds_fewer_bytes(tiny_llama):
    model = tiny_llama
    shape = dr.shape_of_config(model.config)
    ids, mask = left_padded_batch([90, 70])
    exact, plain_cache = forced_logits(model, dr.uniform_plan(shape, dr.Full()), ids, mask)
    errors, sizes = {}, {}
    for bits in (8, 4):
        policy = dr.Full(kv_bits=bits, group=8, residual=16)
        logits, cache = forced_logits(model, dr.uniform_plan(shape, policy), ids, mask)
        errors[bits] = (logits - exact).abs().max().item()
        sizes[bits] = cache.kv_bytes()
        groups = [g for layer in range(shape.num_hidden_layers) for g in cache.head_groups(layer)]
        assert all(g.quantized == Q.quantized_tokens(90 + 12, 8, 16) for g in groups)
    torch.testing.assert_close(logits[:, 0], exact[:, 0], rtol=0, atol=1e-5)  # the prefill attends in full precision
    scale = exact.abs().max().item()
    assert 0 < errors[8] < errors[4] < 0.5 * scale and errors[8] < 0.05 * scale
    assert sizes[4] < sizes[8] < plain_cache.kv_bytes()


def test_a_16_bit_plan_is_the_plan_it_always_was():
    profile = random_profile()
    before = dr.plan(profile, sparsity=0.5)
    assert dr.plan(profile, sparsity=0.5, kv_bits=16, kv_group=4) == before
    assert all(p.to_dict() == {"policy": "full"} for row in before.policies for p in row if not p.bounded)
    assert before.kv_bytes(1000) == sum(
        2 * p.tokens_kept(1000) * 8 * 2 for row in before.policies for p in row
    )  # K+V, head_dim 8, bf16


def test_a_quantized_plan_round_trips_and_says_its_bits():
    profile = random_profile()
    made = dr.plan(profile, sparsity=0.5, kv_bits=4)
    full = {p for row in made.policies for p in row if not p.bounded}
    assert full == {dr.Full(kv_bits=4, group=8, residual=128)}  # head_dim 8: groups of 8 channels, not 32
    assert dr.Plan.from_dict(made.to_dict()) == made
    assert "kv_bits=4" in str(made.summary())


def test_fewer_bits_fit_more_tokens_and_spend_a_budget_on_fewer_bounded_heads():
    profile = random_profile(layers=8, head_dim=64)
    contexts = [dr.plan(profile, sparsity=0.5, kv_bits=bits).max_context("1GB") for bits in (16, 8, 4)]
    assert contexts[0] < contexts[1] < contexts[2]
    assert 3.15 < contexts[2] / contexts[0] < 3.2  # 2 bytes / (0.5 + a bf16 scale and zero per 32 values) = 3.2
    full = dr.plan(profile, sparsity=0.5)
    context = full.max_context("1GB")
    assert full.kv_bytes(context) <= 10**9 < full.kv_bytes(context + 1)
    budget = f"{full.kv_bytes(8192) // 2}B"
    bounded = {bits: dr.plan(profile, budget=budget, context=8192, kv_bits=bits).sparsity for bits in (16, 4)}
    assert bounded[4] < bounded[16]
    mixed = {
        bits: dr.plan(profile, budget=budget, context=8192, policies=("full", "sink_window"), kv_bits=bits)
        for bits in (16, 4)
    }
    assert all(m.kv_bytes(8192) <= full.kv_bytes(8192) // 2 for m in mixed.values())
    assert mixed[4].sparsity < mixed[16].sparsity  # cheaper full heads: more of them fit
    with pytest.raises(dr.PlanError, match="every context fits"):
        dr.plan(profile, sparsity=1.0).max_context("1GB")


@pytest.mark.parametrize(
    "sizes, message",
    [
        (dict(kv_bits=3), "kv_bits must be one of 16, 8, 4"),
        (dict(kv_bits="8"), "kv_bits must be an integer"),
        (dict(kv_bits=True), "kv_bits must be an integer"),
        (dict(kv_bits=8, group=0), "group must be an integer of at least 1"),
        (dict(kv_bits=8, residual=-1), "residual must be an integer of at least 0"),
        (dict(group=16), "a 16-bit head has none"),
    ],
)
def test_bad_quantization_sizes_are_refused(sizes, message):
    with pytest.raises(dr.PlanError, match=message):
        dr.Full(**sizes)


def test_a_group_that_does_not_divide_head_dim_is_refused_with_a_divisor():
    with pytest.raises(dr.PlanError, match=r"group 24 does not divide head_dim 8.*such as 8"):
        dr.plan(random_profile(), sparsity=0.5, kv_bits=8, kv_group=24)


@pytest.mark.parametrize("policy", policy_matrix(names=("full",)))
def test_full_groups_refuse_kept_ranks_whatever_their_width(policy):
    group = policy.make_group([0, 1], 2)
    with pytest.raises(ValueError, match="full heads keep every token"):
        group.kept_ranks(0, 0)

"""`h2o` / `sink_h2o` with `kv_bits` 8 or 4: each slot's codes on their own, the h2o group's every
slot operation on them, bytes as counted, static = dynamic, and the 16-bit policies as they were."""

import dataclasses

import pytest
import torch

import duocal_runtime as dr
from duocal_runtime.policies.base import Step, policy_from_dict
from duocal_runtime.policies.heavy_hitters import H2OGroup
from duocal_runtime.quant import attention as QA
from duocal_runtime.quant import codes as Q

from helpers.models import (
    cpu_compile_config,
    drive_decode,
    greedy_with_logits,
    left_padded_batch,
    padded_decode_steps,
)
from helpers.policy_matrix import policy_matrix

QUANTIZED = [dr.H2O(5, 7, kv_bits=8, group=8), dr.SinkH2O(2, 5, 5, kv_bits=4, group=8)]


@pytest.mark.parametrize("bits", [8, 4])
def test_token_codes_round_trip_within_half_a_step_in_the_counted_bytes(bits):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 10, 32) * torch.linspace(0.1, 8, 32)
    rows = Q.encode_tokens(x, bits, 8)
    assert rows.dtype == torch.uint8 and rows.shape[-1] == Q.token_code_bytes(32, bits, 8, 4)
    back = Q.decode_tokens(rows, bits, 8, 32, torch.float32)
    step = Q.quantize_values(x, bits, 8).scale.repeat_interleave(8, dim=3)
    assert ((back - x).abs() <= step / 2 + 1e-5).all() and (back - x).abs().max() > 0
    assert torch.equal(Q.decode_tokens(rows[:, :, [3, 1]], bits, 8, 32, torch.float32), back[:, :, [3, 1]])
    half = Q.encode_tokens(x.bfloat16(), bits, 8)  # scales and zero points in the cache's dtype
    assert half.shape[-1] == Q.token_code_bytes(32, bits, 8, 2) < rows.shape[-1]


@pytest.mark.parametrize("bits, group", [(8, 8), (4, 8), (4, 16)], ids=["8-bit", "4-bit", "4-bit-group-over-nibbles"])
def test_scores_and_outputs_read_from_token_codes_equal_those_over_their_values(bits, group):
    torch.manual_seed(2)
    keys, values, qg = torch.randn(2, 3, 40, 16), torch.randn(2, 3, 40, 16), torch.randn(2, 3, 4, 16)
    quantized_k, quantized_v = (
        Q.token_rows(Q.encode_tokens(x, bits, group), bits, group, 16, torch.float32) for x in (keys, values)
    )
    dense_k, dense_v = (Q.dequantize_values(c, bits, group, torch.float32) for c in (quantized_k, quantized_v))
    torch.testing.assert_close(QA.token_key_scores(qg, quantized_k, bits, group), qg @ dense_k.transpose(-1, -2))
    p = torch.softmax(qg @ dense_k.transpose(-1, -2), -1)
    torch.testing.assert_close(QA.weighted_values(p, quantized_v, bits, group), p @ dense_v)


class DequantizedH2OGroup(H2OGroup):
    """The reference: a 16-bit h2o group whose stored keys and values are the codes' values."""

    stores_codes = True  # storage is not the tokens as they came: a pass attends to its own tokens as they came

    def _stored_form(self, x):
        p = self.policy
        return Q.decode_tokens(Q.encode_tokens(x, p.kv_bits, p.group), p.kv_bits, p.group, x.shape[-1], x.dtype)


@pytest.mark.parametrize("policy", policy_matrix(names=("h2o", "sink_h2o"), quantized=True))
def test_quantized_slots_attend_and_evict_as_over_their_dequantized_values(policy):
    torch.manual_seed(1)
    b, g, rep, d = 2, 2, 2, 16
    groups = [policy.make_group([0, 1], rep), DequantizedH2OGroup(policy, [0, 1], rep)]
    real = torch.zeros(b, dtype=torch.long)
    seen = 0
    for t in [20, 1, 1, 6, *[1] * 15]:
        q, k, v = torch.randn(b, g * rep, t, d), torch.randn(b, g, t, d), torch.randn(b, g, t, d)
        step = Step.make(seen, real, t, None, d**-0.5)
        quantized, reference = (group.attend(q, k, v, step) for group in groups)
        torch.testing.assert_close(quantized, reference, rtol=0, atol=1e-5)
        assert all(groups[0].kept_ranks(r, h) == groups[1].kept_ranks(r, h) for r in range(b) for h in range(g))
        seen, real = seen + t, step.real_after
    assert groups[0].k.dtype == torch.uint8


@pytest.mark.parametrize("policy", policy_matrix(names=("h2o", "sink_h2o"), quantized=True))
def test_static_quantized_h2o_gives_the_dynamic_tokens_and_the_plans_bytes(policy, tiny_llama):
    model = tiny_llama
    shape = dr.shape_of_config(model.config)
    plan = dr.uniform_plan(shape, policy)
    ids, mask = left_padded_batch([30, 19])
    with dr.apply(model, plan) as runtime:
        dynamic = runtime.new_cache()
        want, want_logits = greedy_with_logits(model, ids, mask, dynamic, 20)
        static = runtime.new_cache(max_length=64)
        got, logits = greedy_with_logits(model, ids, mask, static, 20)
    assert torch.equal(got, want)
    torch.testing.assert_close(logits, want_logits, rtol=0, atol=1e-5)
    per_slot = 2 * Q.token_code_bytes(shape.head_dim, policy.kv_bits, policy.group, 4)  # keys and values, fp32 scales
    assert static.kv_bytes() == 2 * shape.num_kv_heads_total * policy.capacity * per_slot  # batch of 2
    assert plan.kv_bytes(64, 2, "float32") == static.kv_bytes()
    sixteen = dr.uniform_plan(shape, dataclasses.replace(policy, kv_bits=16, group=32))
    assert plan.kv_bytes(64, 1, "bfloat16") <= sixteen.kv_bytes(64, 1, "bfloat16") * (
        0.75 if policy.kv_bits == 8 else 0.5
    )


def test_padded_decode_steps_and_a_follow_up_turn_on_quantized_h2o(tiny_llama):
    model = tiny_llama
    shape = dr.shape_of_config(model.config)
    plan = dr.Plan(
        shape, [[QUANTIZED[0], dr.Full(kv_bits=4, group=8, residual=8)], [QUANTIZED[1], dr.SinkWindow(3, 5)]]
    )
    ids, mask = left_padded_batch([14, 9])
    tokens, new_mask = padded_decode_steps(12, padded=(3, 4, 9))
    with dr.apply(model, plan) as runtime:
        want = drive_decode(model, ids, mask, runtime.new_cache(), tokens, new_mask)
        got = drive_decode(model, ids, mask, runtime.new_cache(max_length=40), tokens, new_mask)
    real = torch.ones(2, 13, dtype=torch.bool)
    real[1, [4, 5, 10]] = False  # outputs at padding positions are unused
    torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_compiled_static_decode_over_quantized_slots_gives_the_eager_tokens_without_graph_breaks(tiny_llama):
    model = tiny_llama
    shape = dr.shape_of_config(model.config)
    plan = dr.Plan(
        shape, [[QUANTIZED[0], dr.Full(kv_bits=4, group=8, residual=8)], [QUANTIZED[1], dr.SinkWindow(3, 5)]]
    )
    ids, mask = left_padded_batch([14, 9])
    config = cpu_compile_config()
    with dr.apply(model, plan) as runtime:
        want, want_logits = greedy_with_logits(model, ids, mask, runtime.new_cache(), 16)
        cache = runtime.new_cache(max_length=40)
        got, logits = greedy_with_logits(model, ids, mask, cache, 16, compile_config=config)
    assert hasattr(model, "_compiled_call"), "generate() did not compile the decode step"
    assert torch.equal(got, want)
    torch.testing.assert_close(logits, want_logits, rtol=0, atol=1e-4)


def test_sixteen_bit_heavy_hitters_are_the_policies_they_were():
    assert dr.H2O(64, 64).to_dict() == {"policy": "h2o", "heavy": 64, "recent": 64}
    assert dr.SinkH2O(4, 60, 64).capacity == 128 and dr.H2O(64, 64).capacity == 128
    assert dr.H2O(5, 7, kv_bits=4, group=8).to_dict() == {
        "policy": "h2o",
        "heavy": 5,
        "recent": 7,
        "kv_bits": 4,
        "group": 8,
    }
    assert policy_from_dict(QUANTIZED[1].to_dict()) == QUANTIZED[1]
    assert QUANTIZED[1].label == "sink_h2o-kv4" and dr.H2O().label == "h2o"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: dr.H2O(kv_bits=3), "kv_bits must be one of 16, 8, 4"),
        (lambda: dr.SinkH2O(group=16), "group size the codes of kv_bits 8 or 4; a 16-bit head has none"),
        (lambda: dr.H2O(kv_bits=8, group=0), "group must be a positive integer"),
    ],
)
def test_bad_code_sizes_are_refused(make, message):
    with pytest.raises(dr.PlanError, match=message):
        make()


def test_codes_that_do_not_fit_the_heads_are_refused(tiny_llama):
    shape = dr.shape_of_config(tiny_llama.config)
    with pytest.raises(dr.PlanError, match="group 12 does not divide head_dim 16"):
        dr.uniform_plan(shape, dr.H2O(5, 7, kv_bits=8, group=12))
    with pytest.raises(dr.PlanError, match="4-bit codes pack two channels per byte; head_dim 15 is odd"):
        dr.SinkH2O(kv_bits=4, group=5).check_head_dim(15)

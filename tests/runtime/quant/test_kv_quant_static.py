"""Quantized full heads in the static cache: the dynamic cache's tokens, fixed buffers, a compileable decode."""

import pytest
import torch

import duocal_runtime as dr
from duocal_runtime.quant import codes as Q

from helpers.models import cpu_compile_config, drive_decode, left_padded_batch, padded_decode_steps
from helpers.models import greedy_with_logits as greedy


def quantized_plan(model, bits, group=8, residual=8, streaming=False) -> dr.Plan:
    shape = dr.shape_of_config(model.config)
    full = dr.Full(kv_bits=bits, group=group, residual=residual)
    other = dr.SinkWindow(3, 5) if streaming else full
    return dr.Plan(shape, [[full] + [other] * (shape.num_key_value_heads - 1)] * shape.num_hidden_layers)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize(
    "group, residual, streaming",
    [(8, 8, False), (8, 5, True), (4, 0, False)],
    ids=["residual-a-group", "residual-not-a-multiple-beside-a-window", "no-residual"],
)
def test_static_quantized_cache_gives_the_dynamic_cache_tokens(bits, group, residual, streaming, tiny_llama):
    """Groups are quantized during decode (30 prompt tokens, 30 new, groups of 4-8): static = dynamic."""
    model = tiny_llama
    ids, mask = left_padded_batch([30, 19])
    with dr.apply(model, quantized_plan(model, bits, group, residual, streaming)) as runtime:
        want, want_logits = greedy(model, ids, mask, runtime.new_cache(), 30)
        got, logits = greedy(model, ids, mask, runtime.new_cache(max_length=64), 30)
    assert torch.equal(got, want)
    torch.testing.assert_close(logits, want_logits, rtol=0, atol=1e-4)


def test_static_quantized_decode_with_padding_tokens_matches_the_dynamic_cache(tiny_llama):
    model = tiny_llama
    ids, mask = left_padded_batch([14, 9])
    tokens, new_mask = padded_decode_steps(24, padded=(3, 4, 9, 17))
    with dr.apply(model, quantized_plan(model, 4, group=4, residual=4)) as runtime:
        want = drive_decode(model, ids, mask, runtime.new_cache(), tokens, new_mask)
        got = drive_decode(model, ids, mask, runtime.new_cache(max_length=40), tokens, new_mask)
    real = torch.ones(2, 25, dtype=torch.bool)
    real[1, [4, 5, 10, 18]] = False  # outputs at padding positions are unused
    torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-4)


def test_follow_up_turn_and_chunked_prefill_on_a_static_quantized_cache(tiny_llama):
    """A second prefill after decode steps reads the residual back out of the ring in order."""
    model = tiny_llama
    ids, _ = left_padded_batch([40])
    follow = torch.randint(1, 97, (1, 11), generator=torch.Generator().manual_seed(3))
    results = []
    for max_length in (None, 96):
        with dr.apply(model, quantized_plan(model, 8, streaming=True), prefill_chunk_size=16) as runtime:
            cache = runtime.new_cache(max_length=max_length)
            turn1 = model.generate(input_ids=ids, max_new_tokens=9, do_sample=False, cache=cache)
            conversation = torch.cat([turn1, follow], dim=1)
            results.append(model.generate(input_ids=conversation, max_new_tokens=9, do_sample=False, cache=cache))
    assert torch.equal(results[0], results[1])


@pytest.mark.parametrize("bits", [8, 4])
def test_static_quantized_cache_holds_codes_for_max_length_and_a_ring(bits, tiny_llama):
    model = tiny_llama
    shape = dr.shape_of_config(model.config)
    group, residual, max_length = 8, 8, 64
    plan = dr.uniform_plan(shape, dr.Full(kv_bits=bits, group=group, residual=residual))
    ids, mask = left_padded_batch([30, 19])
    with dr.apply(model, plan) as runtime:
        cache = runtime.new_cache(max_length=max_length)
        greedy(model, ids, mask, cache, 4)
    d, fp32 = shape.head_dim, 4
    quantized = Q.quantized_tokens(max_length, group, residual) + group  # one spare group
    codes = 2 * quantized * d * bits // 8
    scales = (
        2 * (quantized // group) * d * fp32 + 2 * quantized * (d // group) * fp32
    )  # keys per channel, values per token
    ring = 2 * (residual + group) * d * fp32
    per_head = codes + scales + ring
    assert cache.kv_bytes() == 2 * shape.num_key_value_heads * shape.num_hidden_layers * per_head  # batch of 2


@pytest.mark.parametrize("bits", [8, 4])
def test_static_quantized_bytes_approach_the_analytic_size(bits):
    """The spare group and the ring's extra group cost 2-3% at 4k tokens, under 0.5% at 32k (bf16, head_dim 64)."""
    for max_length, within in ((4096, 0.031), (32768, 0.005)):
        group = dr.Full(kv_bits=bits).make_group([0], 1, max_length=max_length)
        group.fill(1, 10, 64, torch.bfloat16, "cpu")
        analytic = Q.quantized_bytes(max_length, 64, bits, 32, 128, 2)
        assert analytic < group.nbytes() <= analytic * (1 + within)


@pytest.mark.slow
def test_compiled_static_quantized_decode_gives_the_eager_tokens_without_graph_breaks(tiny_llama):
    model = tiny_llama
    ids, mask = left_padded_batch([14, 9])
    config = cpu_compile_config()
    with dr.apply(model, quantized_plan(model, 4, group=4, residual=4, streaming=True)) as runtime:
        want, want_logits = greedy(model, ids, mask, runtime.new_cache(), 20)
        got, logits = greedy(model, ids, mask, runtime.new_cache(max_length=48), 20, compile_config=config)
    assert hasattr(model, "_compiled_call"), "generate() did not compile the decode step"
    assert torch.equal(got, want)
    torch.testing.assert_close(logits, want_logits, rtol=0, atol=1e-4)

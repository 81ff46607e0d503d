"""Quantized full heads (`full(kv_bits=8|4)`) in continuous batching: codes in the pages, the residual in a
ring among the bounded slots; the tokens of duocal's own generate(), the bytes of the codes."""

import pytest
import torch
from test_paged_batching import alone, config, gen, join_mid_decode, prompts

import duocal_runtime as dr
from duocal_runtime.paged.paged_cache import pool_summary

from helpers.models import tiny_model

QUANTIZED = [  # layer 0 / layer 1 of a 2-layer, 2-KV-head model (head_dim 16)
    [dr.Full(kv_bits=8, group=8, residual=16), dr.Full()],
    [dr.Full(kv_bits=4, group=8, residual=5), dr.SinkWindow(3, 9)],
]
SIXTEEN_BIT = [[dr.Full(), dr.Full()], [dr.Full(), dr.SinkWindow(3, 9)]]


def test_batched_tokens_equal_generate_and_read_the_codes(tiny_llama):
    shape, batch = dr.shape_of_config(tiny_llama.config), prompts([5, 40, 130, 23, 300])
    with dr.apply(tiny_llama, dr.Plan(shape, SIXTEEN_BIT)) as runtime:
        plain = [alone(tiny_llama, runtime, p, new=30) for p in batch]
    with dr.apply(tiny_llama, dr.Plan(shape, QUANTIZED)) as runtime:
        want = [alone(tiny_llama, runtime, p, new=30) for p in batch]
        got = tiny_llama.generate_batch(inputs=batch, generation_config=gen(30), continuous_batching_config=config())
    assert [r.generated_tokens for r in got.values()] == want
    assert want != plain  # the codes are what was read: 16-bit storage answers otherwise


def test_a_prompt_split_across_passes_equals_duocals_chunked_prefill(tiny_llama):
    plan, prompt = dr.Plan(dr.shape_of_config(tiny_llama.config), QUANTIZED), prompts([300])[0]
    with dr.apply(tiny_llama, plan, prefill_chunk_size=64) as runtime:
        want = alone(tiny_llama, runtime, prompt, new=20)
    with dr.apply(tiny_llama, plan):
        got = tiny_llama.generate_batch(
            inputs=[prompt], generation_config=gen(20), continuous_batching_config=config(max_batch_tokens=64)
        )
    assert next(iter(got.values())).generated_tokens == want


def test_requests_that_join_while_others_decode_get_their_own_codes(tiny_llama):
    plan, batch = dr.Plan(dr.shape_of_config(tiny_llama.config), QUANTIZED), prompts([90, 12, 150, 33], seed=5)
    with dr.apply(tiny_llama, plan) as runtime:
        want = [alone(tiny_llama, runtime, p, new=24) for p in batch]
        manager = tiny_llama.init_continuous_batching(gen(24), config())
        manager.start()
        try:
            assert join_mid_decode(manager, batch, 24) == want
            assert manager.cache.free_sectors() == manager.cache.num_sectors
        finally:
            manager.stop(block=True)


@pytest.mark.parametrize("bits", [8, 4])
def test_a_quantized_request_holds_the_plans_analytic_bytes(tiny_llama, bits):
    shape = dr.shape_of_config(tiny_llama.config)
    plan = dr.uniform_plan(shape, dr.Full(kv_bits=bits, group=16, residual=32))
    with dr.apply(tiny_llama, plan):
        cache = tiny_llama.init_continuous_batching(gen(), config(page_size=32)).cache
    ring = (
        shape.num_hidden_layers * shape.num_key_value_heads * 2 * (32 + 16) * shape.head_dim * tiny_llama.dtype.itemsize
    )
    for tokens in (1, 100, 1000):
        analytic = plan.kv_bytes(tokens, 1, tiny_llama.dtype)
        codes = -(-tokens // 32) * 32  # page rounding: rows of the residual's tokens are allocated too
        page_bound = plan.kv_bytes(codes + 32, 1, tiny_llama.dtype) + ring + 4096  # + the ring, alignment
        assert analytic * 0.99 <= cache.bytes_for(tokens) <= page_bound
    assert cache.bytes_for(1000) <= 1.05 * plan.kv_bytes(1000, 1, tiny_llama.dtype) + ring


def test_the_pool_holds_more_quantized_requests(tiny_llama):
    shape, held = dr.shape_of_config(tiny_llama.config), {}
    for bits in (16, 8, 4):
        plan = dr.uniform_plan(shape, dr.Full.storing(bits, group=16))
        with dr.apply(tiny_llama, plan):
            cache = tiny_llama.init_continuous_batching(gen(), config(page_size=32, num_blocks=256)).cache
            held[bits] = pool_summary(cache, 1024, 32)["requests"]
    assert held[16] < held[8] < held[4]
    assert held[4] >= 2.5 * held[16]


def test_a_page_that_splits_a_code_group_is_refused_with_the_size_to_use(tiny_llama):
    plan = dr.uniform_plan(dr.shape_of_config(tiny_llama.config), dr.Full(kv_bits=4, group=16))
    with dr.apply(tiny_llama, plan):
        with pytest.raises(dr.PlanError, match="multiple of 16"):
            tiny_llama.generate_batch(
                inputs=prompts([8]), generation_config=gen(), continuous_batching_config=config(page_size=24)
            )


def test_bf16_codes_in_pages_equal_generate():
    model = tiny_model("llama", dtype=torch.bfloat16)
    plan, batch = dr.Plan(dr.shape_of_config(model.config), QUANTIZED), prompts([60, 200])
    with dr.apply(model, plan) as runtime:
        want = [alone(model, runtime, p, new=16) for p in batch]
        got = model.generate_batch(inputs=batch, generation_config=gen(16), continuous_batching_config=config())
    assert [r.generated_tokens for r in got.values()] == want

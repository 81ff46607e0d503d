"""Continuous batching with a plan: transformers' engine (scheduler, requests, sampling) over duocal's
paged cache gives duocal's own generate() tokens for every policy, mixed prompt lengths and requests
that join mid-batch; pages return to the pool; a plan's bytes are what the scheduler admits by."""

import time

import pytest
import torch
from transformers import ContinuousBatchingConfig, GenerationConfig

import duocal_runtime as dr
from duocal_runtime.paged.manager import PlanRequestError

from helpers.policy_matrix import policy_matrix

NEW = 10
MIXED = {  # layer 0 / layer 1 of a 2-layer, 2-KV-head model
    "sink_window": [[dr.Full(), dr.SinkWindow(4, 12)], [dr.SinkWindow(2, 20), dr.SinkWindow(2, 20)]],
    "h2o": [[dr.H2O(6, 6), dr.Full()], [dr.Full(), dr.H2O(4, 10)]],
    "sink_h2o": [[dr.SinkH2O(2, 5, 6), dr.SinkWindow(3, 9)], [dr.Full(), dr.Full()]],
    "mixed": [[dr.SinkWindow(4, 16), dr.H2O(8, 8)], [dr.Full(), dr.SinkH2O(2, 6, 8)]],
    "quantized-h2o": [  # bounded heads in codes: their blocks hold the static group's rows of codes
        [dr.H2O(6, 6, kv_bits=8, group=8), dr.Full()],
        [dr.SinkWindow(3, 9), dr.SinkH2O(2, 5, 6, kv_bits=4, group=8)],
    ],
    "quantized-full": [  # full heads in codes: codes in the pages, the residual in a ring among the slots
        [dr.Full(kv_bits=8, group=8, residual=16), dr.Full()],
        [dr.Full(kv_bits=4, group=8, residual=5), dr.SinkWindow(3, 9)],
    ],
}


def prompts(lengths, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 97, (n,), generator=g).tolist() for n in lengths]


def config(**kw):
    return ContinuousBatchingConfig(**{"page_size": 16, "num_blocks": 64, "max_batch_tokens": 512, **kw})


def gen(new=NEW):
    return GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=-1, pad_token_id=0)


def alone(model, runtime, prompt, new=NEW):
    out = model.generate(
        input_ids=torch.tensor([prompt]), max_new_tokens=new, do_sample=False, cache=runtime.new_cache()
    )
    return out[0, len(prompt) :].tolist()


def join_mid_decode(manager, batch, new: int) -> list[list[int]]:
    """The first request is decoding when the others arrive: every request's tokens, in order."""
    first = manager.add_request(batch[0], max_new_tokens=new, streaming=True)
    while len(next(manager.request_id_iter(first)).generated_tokens) < 3:
        pass
    ids = [first] + [manager.add_request(p, max_new_tokens=new) for p in batch[1:]]
    results = {}
    while len(results) < len(ids):
        out = manager.get_result(timeout=30)
        if out is not None and out.is_finished():
            results[out.request_id] = out.generated_tokens
    return [results[i] for i in ids]


@pytest.mark.parametrize("kind", sorted(MIXED))
def test_batched_tokens_equal_generate_for_every_policy(tiny_llama, kind):
    plan = dr.Plan(dr.shape_of_config(tiny_llama.config), MIXED[kind])
    batch = prompts([5, 40, 130, 23, 300])
    with dr.apply(tiny_llama, plan) as runtime:
        want = [alone(tiny_llama, runtime, p) for p in batch]
        got = tiny_llama.generate_batch(inputs=batch, generation_config=gen(), continuous_batching_config=config())
    assert [r.generated_tokens for r in got.values()] == want


@pytest.mark.parametrize("policy", policy_matrix(cache_positions=False))
def test_every_policy_alone_batches_like_generate(tiny_llama, policy):
    """Each policy of the shared matrix on every head: the mixes above pair policies, this one finds a
    policy that fails only where it is alone (and covers a new policy without a new mix)."""
    plan = dr.uniform_plan(dr.shape_of_config(tiny_llama.config), policy)
    batch = prompts([5, 40, 130])
    with dr.apply(tiny_llama, plan) as runtime:
        want = [alone(tiny_llama, runtime, p) for p in batch]
        got = tiny_llama.generate_batch(inputs=batch, generation_config=gen(), continuous_batching_config=config())
    assert [r.generated_tokens for r in got.values()] == want


def test_a_plan_whose_heads_see_cache_positions_is_refused_before_any_request(tiny_llama):
    """transformers' scheduler gives the model positions of its own: such a plan is generate()'s."""
    plan = dr.uniform_plan(dr.shape_of_config(tiny_llama.config), dr.SinkWindow(4, 8, positions="cache"))
    with dr.apply(tiny_llama, plan), pytest.raises(dr.PlanError, match=r"model\.generate\(\)"):
        tiny_llama.generate_batch(inputs=prompts([5]), generation_config=gen(), continuous_batching_config=config())


def test_the_all_full_plan_equals_plain_continuous_batching(tiny_llama):
    batch = prompts([7, 64, 200])
    plain = tiny_llama.generate_batch(
        inputs=batch, generation_config=gen(), continuous_batching_config=config(allow_block_sharing=False)
    )
    with dr.apply(tiny_llama, dr.uniform_plan(dr.shape_of_config(tiny_llama.config), dr.Full())):
        ours = tiny_llama.generate_batch(inputs=batch, generation_config=gen(), continuous_batching_config=config())
    assert [r.generated_tokens for r in ours.values()] == [r.generated_tokens for r in plain.values()]


def test_requests_that_join_while_others_decode_and_prompts_split_across_passes(tiny_llama):
    """A small max_batch_tokens splits long prompts across passes (exact for sink windows); requests
    arrive while others decode; sampling with a seed repeats itself."""
    plan = dr.Plan(dr.shape_of_config(tiny_llama.config), MIXED["sink_window"])
    batch = prompts([90, 12, 150, 33])
    with dr.apply(tiny_llama, plan) as runtime:
        want = [alone(tiny_llama, runtime, p, new=24) for p in batch]
        manager = tiny_llama.init_continuous_batching(gen(24), config(max_batch_tokens=48))
        manager.start()
        try:
            assert join_mid_decode(manager, batch, 24) == want
            cache = manager.cache
            assert cache.free_sectors() == cache.num_sectors  # every page is back in the pool
        finally:
            manager.stop(block=True)


def test_h2o_prompts_are_prefilled_in_one_pass_whatever_the_load(tiny_llama):
    plan = dr.Plan(dr.shape_of_config(tiny_llama.config), MIXED["h2o"])
    batch = prompts([60, 60, 60, 9])
    with dr.apply(tiny_llama, plan) as runtime:
        want = [alone(tiny_llama, runtime, p) for p in batch]
        got = tiny_llama.generate_batch(
            inputs=batch, generation_config=gen(), continuous_batching_config=config(max_batch_tokens=64)
        )
        assert [r.generated_tokens for r in got.values()] == want
        manager = tiny_llama.init_continuous_batching(gen(), config(max_batch_tokens=64))
        manager.start()
        try:
            with pytest.raises(PlanRequestError, match="longer than max_batch_tokens"):
                manager.add_request(prompts([65])[0])
        finally:
            manager.stop(block=True)


def test_a_request_the_pool_can_never_hold_is_refused_at_once(tiny_llama):
    plan = dr.Plan(dr.shape_of_config(tiny_llama.config), MIXED["sink_window"])
    with dr.apply(tiny_llama, plan):
        manager = tiny_llama.init_continuous_batching(gen(), config(num_blocks=4))
        manager.start()
        try:
            started = time.perf_counter()
            with pytest.raises(
                PlanRequestError, match=r"needs [\d.]+ KiB \([\d,]+ bytes\) of KV cache, more than the whole pool"
            ):
                manager.add_request(prompts([300])[0], max_new_tokens=100)
            assert time.perf_counter() - started < 5
        finally:
            manager.stop(block=True)


def test_cancelled_requests_free_their_pages(tiny_llama):
    plan = dr.Plan(dr.shape_of_config(tiny_llama.config), MIXED["mixed"])
    with dr.apply(tiny_llama, plan):
        manager = tiny_llama.init_continuous_batching(gen(400), config())
        manager.start()
        try:
            rid = manager.add_request(prompts([50])[0], max_new_tokens=400, streaming=True)
            while len(next(manager.request_id_iter(rid)).generated_tokens) < 2:
                pass
            assert manager.cache.free_sectors() < manager.cache.num_sectors
            manager.cancel_request(rid)
            deadline = time.perf_counter() + 20
            while manager.cache.free_sectors() < manager.cache.num_sectors and time.perf_counter() < deadline:
                time.sleep(0.05)
            assert manager.cache.free_sectors() == manager.cache.num_sectors
        finally:
            manager.stop(block=True)


def test_request_bytes_are_the_plans_analytic_size_with_page_rounding(tiny_llama):
    plan = dr.Plan(dr.shape_of_config(tiny_llama.config), MIXED["mixed"])
    with dr.apply(tiny_llama, plan):
        cache = tiny_llama.init_continuous_batching(gen(), config()).cache
    shape, itemsize = plan.shape, tiny_llama.dtype.itemsize
    for tokens in (1, 16, 17, 300):
        full = sum(not p.bounded for row in plan.policies for p in row)
        pages = -(-tokens // 16) * 16 * full * 2 * shape.head_dim * itemsize
        bounded = sum(p.capacity for row in plan.policies for p in row if p.bounded) * 2 * shape.head_dim * itemsize
        assert pages + bounded <= cache.bytes_for(tokens) <= 1.05 * (pages + bounded) + 4096  # ranks, scores, alignment
        assert cache.bytes_for(tokens) <= plan.kv_bytes(tokens, 1, tiny_llama.dtype) * 1.05 + 16 * full * 512 + 4096


def test_quantized_bounded_heads_take_their_codes_bytes_in_the_pool(tiny_llama):
    shape = dr.shape_of_config(tiny_llama.config)
    byte_sizes = {}
    for bits in (16, 4):
        quantized = {} if bits == 16 else {"kv_bits": 4, "group": 8}
        plan = dr.uniform_plan(shape, dr.H2O(24, 24, **quantized))
        with dr.apply(tiny_llama, plan):
            byte_sizes[bits] = tiny_llama.init_continuous_batching(gen(), config()).cache.bytes_for(100)
        assert byte_sizes[bits] <= plan.kv_bytes(100, 1, tiny_llama.dtype) * 1.05 + 4096  # ranks, scores, alignment
    assert byte_sizes[4] < byte_sizes[16] * 0.7


def test_remove_gives_the_model_its_own_continuous_batching_back(tiny_llama):
    plan = dr.Plan(dr.shape_of_config(tiny_llama.config), MIXED["sink_window"])
    runtime = dr.apply(tiny_llama, plan)
    assert "init_continuous_batching" in vars(tiny_llama)
    runtime.remove()
    assert "init_continuous_batching" not in vars(tiny_llama)
    plain = tiny_llama.generate_batch(
        inputs=prompts([20]), generation_config=gen(), continuous_batching_config=config(allow_block_sharing=False)
    )
    assert len(next(iter(plain.values())).generated_tokens) == NEW
    with pytest.raises(RuntimeError, match="removed"):
        runtime.init_continuous_batching(gen(), config())


def test_a_plan_without_full_heads_decodes_long_requests(tiny_llama):
    """Bounded heads read their own slots: the engine's read budget must not starve them."""
    plan = dr.uniform_plan(dr.shape_of_config(tiny_llama.config), dr.H2O(8, 8))
    batch = prompts([300, 250, 280])
    with dr.apply(tiny_llama, plan) as runtime:
        want = [alone(tiny_llama, runtime, p) for p in batch]
        got = tiny_llama.generate_batch(
            inputs=batch, generation_config=gen(), continuous_batching_config=config(num_blocks=4)
        )
    assert [r.generated_tokens for r in got.values()] == want


def test_a_request_beyond_the_models_positions_is_refused(tiny_llama):
    plan = dr.Plan(dr.shape_of_config(tiny_llama.config), MIXED["sink_window"])
    with dr.apply(tiny_llama, plan):
        manager = tiny_llama.init_continuous_batching(gen(), config(num_blocks=4096))
        manager.start()
        try:
            with pytest.raises(PlanRequestError, match="beyond the model's 512 positions"):
                manager.add_request(prompts([500])[0], max_new_tokens=20)
        finally:
            manager.stop(block=True)


def test_an_empty_or_out_of_vocabulary_request_fails_alone_in_generate_batch(tiny_llama):
    plan = dr.Plan(dr.shape_of_config(tiny_llama.config), MIXED["mixed"])
    good = prompts([20])[0]
    with dr.apply(tiny_llama, plan) as runtime:
        want = alone(tiny_llama, runtime, good)
        got = tiny_llama.generate_batch(
            inputs=[[], good, [tiny_llama.config.vocab_size + 3]],
            generation_config=gen(),
            continuous_batching_config=config(),
        )
    empty, kept, outside = got.values()
    assert "the prompt is empty" in empty.error and empty.generated_tokens == []
    assert "outside the vocabulary" in outside.error
    assert kept.error is None and kept.generated_tokens == want


def test_a_failed_forward_pass_fails_its_requests_and_the_worker_goes_on(tiny_llama):
    """A fault injected in the embedding for one marked prompt: that request fails, the next one runs."""
    plan = dr.Plan(dr.shape_of_config(tiny_llama.config), MIXED["mixed"])
    marker = 96

    def fail_on_marker(_module, args):
        if (args[0] == marker).all():
            raise RuntimeError("injected fault")

    with dr.apply(tiny_llama, plan) as runtime:
        good = [t for t in prompts([20])[0] if t != marker]
        want = alone(tiny_llama, runtime, good)
        manager = tiny_llama.init_continuous_batching(gen(), config())
        manager.start()
        hook = tiny_llama.get_input_embeddings().register_forward_pre_hook(fail_on_marker)
        try:
            bad = manager.add_request([marker] * 3)
            failed = manager.get_result(request_id=bad, timeout=30)
            hook.remove()
            assert failed is not None and "injected fault" in failed.error
            rid = manager.add_request(good)
            out = manager.get_result(request_id=rid, timeout=30)
            assert out is not None and out.error is None and out.generated_tokens == want
            assert manager.is_running() and manager.cache.free_sectors() == manager.cache.num_sectors
        finally:
            hook.remove()
            manager.stop(block=True)

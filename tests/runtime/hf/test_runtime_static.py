"""The static cache (`runtime.new_cache(max_length=N)`): fixed buffers, compileable decode steps.

Eager on CPU it must give the dynamic cache's tokens and logits for every policy, padding,
GQA/MHA and family; compiled with `fullgraph=True` (no graph break anywhere in a decode step)
it must give the same tokens too.
"""

from functools import partial

import pytest
import torch

import duocal_runtime as dr

from helpers.models import (
    cpu_compile_config,
    drive_decode,
    greedy_with_logits,
    left_padded_batch,
    padded_decode_steps,
    tiny_model,
)
from helpers.policy_matrix import policy_matrix

MIXED = [
    [dr.SinkWindow(3, 5), dr.H2O(4, 3)],
    [dr.SinkH2O(2, 3, 4), dr.Full()],
]

greedy = partial(greedy_with_logits, steps=16)


def mixed_plan(model) -> dr.Plan:
    shape = dr.shape_of_config(model.config)
    table = MIXED if shape.num_key_value_heads == 2 else [row + row for row in MIXED]
    return dr.Plan(shape, table)


@pytest.mark.parametrize("family", ["llama", "llama_mha", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("lengths", [[21], [14, 9]], ids=["one-row", "left-padded"])
def test_static_cache_gives_the_dynamic_cache_tokens(family, lengths):
    model = tiny_model(family)
    ids, mask = left_padded_batch(lengths)
    with dr.apply(model, mixed_plan(model)) as runtime:
        want, want_logits = greedy(model, ids, mask, runtime.new_cache())
        got, logits = greedy(model, ids, mask, runtime.new_cache(max_length=ids.shape[1] + 16))
    assert torch.equal(got, want)
    torch.testing.assert_close(logits, want_logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("policy", policy_matrix(bits=16))
def test_every_policy_static_equals_dynamic_and_holds_its_preallocation(policy, tiny_llama):
    model = tiny_llama
    shape = dr.shape_of_config(model.config)
    plan = dr.uniform_plan(shape, policy)
    ids, mask = left_padded_batch([30, 19])
    with dr.apply(model, plan) as runtime:
        want, _ = greedy(model, ids, mask, runtime.new_cache(), steps=20)
        cache = runtime.new_cache(max_length=64)
        got, _ = greedy(model, ids, mask, cache, steps=20)
    assert torch.equal(got, want)
    slots = 64 if policy.capacity is None else policy.capacity
    per_slot = 2 * 2 * shape.num_key_value_heads * shape.head_dim * 4 * shape.num_hidden_layers  # K+V, B=2, fp32
    assert cache.kv_bytes() == slots * per_slot
    assert int(cache.get_seq_length()) == 30 + 19


def test_static_decode_steps_with_padding_tokens_match_the_dynamic_cache(tiny_llama):
    """A row can feed padding mid-generation (0 in the mask): the static step must skip it."""
    model = tiny_llama
    ids, mask = left_padded_batch([14, 9])
    tokens, new_mask = padded_decode_steps(12, padded=(3, 4, 9))
    with dr.apply(model, mixed_plan(model)) as runtime:
        want = drive_decode(model, ids, mask, runtime.new_cache(), tokens, new_mask)
        got = drive_decode(model, ids, mask, runtime.new_cache(max_length=40), tokens, new_mask)
    real = torch.ones(2, 13, dtype=torch.bool)
    real[1, [4, 5, 10]] = False  # outputs at padding positions are unused
    torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-5)


def test_follow_up_turn_and_chunked_prefill_on_a_static_cache(tiny_llama):
    model = tiny_llama
    ids, _ = left_padded_batch([40])
    follow = torch.randint(1, 97, (1, 7), generator=torch.Generator().manual_seed(3))
    plan = mixed_plan(model)
    results = []
    for max_length in (None, 80):
        with dr.apply(model, plan, prefill_chunk_size=16) as runtime:
            cache = runtime.new_cache(max_length=max_length)
            turn1 = model.generate(input_ids=ids, max_new_tokens=6, do_sample=False, cache=cache)
            conversation = torch.cat([turn1, follow], dim=1)
            results.append(model.generate(input_ids=conversation, max_new_tokens=6, do_sample=False, cache=cache))
    assert torch.equal(results[0], results[1])


@pytest.mark.slow
def test_compiled_static_decode_gives_the_eager_tokens_without_graph_breaks(tiny_llama):
    """generate() compiles the decode step by itself for a compileable cache (on CPU when asked to)."""
    model = tiny_llama
    ids, mask = left_padded_batch([14, 9])
    config = cpu_compile_config()
    with dr.apply(model, mixed_plan(model)) as runtime:
        want, want_logits = greedy(model, ids, mask, runtime.new_cache())
        got, logits = greedy(model, ids, mask, runtime.new_cache(max_length=48), compile_config=config)
    assert hasattr(model, "_compiled_call"), "generate() did not compile the decode step"
    assert torch.equal(got, want)
    torch.testing.assert_close(logits, want_logits, rtol=0, atol=1e-4)


def test_static_cache_refuses_to_grow_past_max_length(tiny_llama):
    model = tiny_llama
    ids, _mask = left_padded_batch([20])
    with dr.apply(model, mixed_plan(model)) as runtime:
        with pytest.raises(dr.CacheFullError, match="max_length=16"):
            model(input_ids=ids, cache=runtime.new_cache(max_length=16))
        with pytest.raises(dr.CacheFullError, match="max_length=24"):
            model.generate(input_ids=ids, max_new_tokens=10, do_sample=False, cache=runtime.new_cache(max_length=24))
        with pytest.raises(dr.CacheFullError, match="max_length=20"):  # max_length == prompt: no room to generate
            model.generate(input_ids=ids, max_new_tokens=2, do_sample=False, cache=runtime.new_cache(max_length=20))


@pytest.mark.parametrize("bad", [0, -5, 2.5, "64", True])
def test_bad_max_length_is_refused(bad, tiny_llama):
    model = tiny_llama
    with dr.apply(model, mixed_plan(model)) as runtime:
        with pytest.raises(dr.PlanError, match="max_length"):
            runtime.new_cache(max_length=bad)


def test_static_cache_of_a_removed_runtime_is_refused(tiny_llama):
    model = tiny_llama
    ids, _ = left_padded_batch([12])
    runtime = dr.apply(model, mixed_plan(model))
    cache = runtime.new_cache(max_length=32)
    model.generate(input_ids=ids, max_new_tokens=3, do_sample=False, cache=cache)
    runtime.remove()
    with dr.apply(model, mixed_plan(model)):
        with pytest.raises(RuntimeError, match="removed"):
            model.generate(input_ids=ids, max_new_tokens=3, do_sample=False, cache=cache)


def test_compiling_the_static_decode_on_an_unsupported_device_says_so(monkeypatch, tiny_llama):
    from duocal_runtime.hf import cache as cache_module

    monkeypatch.setattr(cache_module, "COMPILE_DEVICES", ("cuda",))  # as if this CPU were such a device
    model = tiny_llama
    with dr.apply(model, mixed_plan(model)) as runtime:
        ids, cache = prefilled_static_cache(model, runtime)
        step = torch.compile(model.forward, fullgraph=True)
        with torch.no_grad(), pytest.raises(Exception, match=r"does not support torch.compile on cpu"):
            step(input_ids=ids[:, :1], position_ids=torch.tensor([[12]]), cache=cache)


def prefilled_static_cache(model, runtime):
    """A 12-token prompt prefilled into a fresh static cache of 32 slots: (ids, cache)."""
    ids, _ = left_padded_batch([12])
    cache = runtime.new_cache(max_length=32)
    with torch.no_grad():
        model(input_ids=ids, cache=cache)
    return ids, cache


def test_mixed_layers_move_their_head_indices_to_the_heads_device_at_fixed_addresses(monkeypatch, tiny_llama):
    """A layer with several groups indexes its heads; indices left on the CPU put a host-to-device copy
    in every decode step, which CUDA graph capture refuses (generate() crashed on an H200). Every eager
    pass puts them on the heads' device (once), at addresses marked static."""
    from duocal_runtime.hf.cache import DuoCacheLayer

    placed, place = [], DuoCacheLayer._place_head_indices
    monkeypatch.setattr(DuoCacheLayer, "_place_head_indices", lambda self, d: placed.append(d) or place(self, d))
    model = tiny_llama
    with dr.apply(model, mixed_plan(model)) as runtime:
        _, cache = prefilled_static_cache(model, runtime)
    assert placed and all(d.type == "cpu" for d in placed), "the prefill did not place the head indices"
    for layer in cache.layers:
        for indices in layer._indices:
            assert all(getattr(i, "_dynamo_static_input_type", None) for i in indices), "not at fixed addresses"
        layer._place_head_indices(torch.device("meta"))  # heads on another device than the indices
        assert all(i.device.type == "meta" for indices in layer._indices for i in indices)

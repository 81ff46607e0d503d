"""The Python API checks its arguments at the call and names the one that is wrong."""

import math

import pytest
import torch

import duocal_runtime as dr

from helpers.models import tiny_model
from helpers.profiles import random_profile


@pytest.mark.parametrize(
    "call,error,message",
    [
        (lambda p: dr.plan("x.json"), TypeError, "profile must be a Profile"),
        (lambda p: dr.plan(p, sparsity="half"), TypeError, "sparsity must be a number"),
        (lambda p: dr.plan(p, sparsity=math.nan), ValueError, "sparsity must be a finite number"),
        (lambda p: dr.plan(p, sparsity=1.5), ValueError, r"sparsity must be in \[0, 1\]"),
        (lambda p: dr.plan(p, threshold="0.3"), TypeError, "threshold must be a number"),
        (lambda p: dr.plan(p, threshold=math.nan), ValueError, "threshold must be a finite number"),
        (lambda p: dr.plan(p, budget="1MiB", context="1024"), TypeError, "context must be an integer"),
        (lambda p: dr.plan(p, budget="1MiB", context=math.nan), TypeError, "context must be an integer"),
        (lambda p: dr.plan(p, budget="1e999GiB", context=1024), ValueError, "cannot read budget"),
        (lambda p: dr.plan(p, batch=0), ValueError, "batch must be at least 1"),
        (lambda p: dr.load_profile(None), TypeError, "ref must be a path"),
        (lambda p: dr.load_profile(""), ValueError, "ref is empty"),
        (lambda p: dr.pull(3), TypeError, "ref must be a path"),
        (lambda p: dr.plan(p, sparsity=0.5).kv_bytes(math.inf), TypeError, "context must be an integer"),
    ],
)
def test_bad_arguments_name_themselves(call, error, message):
    with pytest.raises(error, match=message):
        call(random_profile())


def test_apply_refuses_a_profile_or_a_non_model(tiny_llama):
    model = tiny_llama
    profile = random_profile(layers=2, kv_heads=2, heads=4, head_dim=16)
    with pytest.raises(TypeError, match=r"plan must be a Plan \(make one with dr.plan"):
        dr.apply(model, profile)
    with pytest.raises(TypeError, match="model must be a transformers PreTrainedModel"):
        dr.apply("gpt2", dr.plan(profile, sparsity=0.5))


def test_a_mask_over_only_the_new_tokens_is_refused(tiny_llama):
    import torch

    from helpers.models import left_padded_batch

    model = tiny_llama
    ids, _ = left_padded_batch([12])
    with dr.apply(model, dr.uniform_plan(dr.shape_of_config(model.config), dr.Full())) as runtime:
        cache = runtime.new_cache()
        model(input_ids=ids, cache=cache)
        with pytest.raises(ValueError, match="attention_mask covers 1 tokens but the cache and input make 13"):
            model(input_ids=ids[:, :1], attention_mask=torch.ones(1, 1, dtype=torch.long), cache=cache)


# --- issue: misleading messages of the runtime API ------------------------------------------
def _tiny():
    from helpers.models import left_padded_batch

    model = tiny_model("llama")
    return model, dr.Plan(dr.shape_of_config(model.config), [[dr.SinkWindow(2, 6), dr.Full()]] * 2), left_padded_batch


def test_a_cache_given_another_batch_size_says_so():
    model, plan, batch = _tiny()
    with dr.apply(model, plan) as runtime:
        cache = runtime.new_cache()
        ids, mask = batch([10, 8])
        model(input_ids=ids, attention_mask=mask, cache=cache)
        ids3, _ = batch([10, 8, 9])
        with pytest.raises(ValueError, match="holds 2 sequences but was given a batch of 3"):
            model(input_ids=ids3, attention_mask=torch.ones(3, 20, dtype=torch.long), cache=cache)


def test_a_deep_copy_of_a_used_cache_is_independent_and_keeps_its_runtime():
    import copy

    model, plan, batch = _tiny()
    ids, mask = batch([12])
    with dr.apply(model, plan) as runtime:
        cache = runtime.new_cache()
        model(input_ids=ids, attention_mask=mask, cache=cache)
        twin = copy.deepcopy(cache)
        nxt = torch.tensor([[5]])
        grown = torch.cat([mask, torch.ones(1, 1, dtype=mask.dtype)], 1)
        a = model(input_ids=nxt, attention_mask=grown, cache=cache).logits
        b = model(input_ids=nxt, attention_mask=grown, cache=twin).logits
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert twin.get_seq_length() == cache.get_seq_length() == 13
        assert twin.layers[0].owner is runtime and twin.layers[0].groups[0].k is not cache.layers[0].groups[0].k


def test_numpy_integers_are_numbers_and_wrong_chunk_sizes_name_the_argument():
    import numpy as np

    model, plan, _ = _tiny()
    profile = random_profile(layers=2, kv_heads=2, heads=4, head_dim=16)
    assert dr.plan(profile, budget=np.int64(2500), context=np.int64(1000)).num_bounded == 3
    for bad in (1.5, "64", True, 0):
        with pytest.raises((TypeError, ValueError), match="prefill_chunk_size"):
            dr.apply(model, plan, prefill_chunk_size=bad)
    runtime = dr.apply(model, plan, prefill_chunk_size=np.int32(64))
    runtime.remove()
    with pytest.raises(TypeError, match=r"policies must be a list of policy names.*'full,h2o'"):
        dr.plan(profile, budget="1MiB", context=100, policies="full,h2o")


def test_crop_says_why_a_duocache_cannot_be_cropped():
    model, plan, _batch = _tiny()
    with dr.apply(model, plan) as runtime:
        cache = runtime.new_cache()
        with pytest.raises(NotImplementedError, match=r"cannot be cropped.*new_cache"):
            cache.crop(4)


def test_a_used_cache_given_another_conversation_is_refused():
    """A DuoCache shared by a pipeline's inputs answered the second from the first one's keys: refused."""
    model, plan, batch = _tiny()
    ids, mask = batch([12])
    other, other_mask = batch([12], seed=9)
    with dr.apply(model, plan) as runtime:
        cache = runtime.new_cache()
        first = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, do_sample=False, cache=cache)
        follow = torch.cat([first, torch.tensor([[7, 8]])], 1)  # a follow-up turn continues: allowed
        model.generate(input_ids=follow, max_new_tokens=2, do_sample=False, cache=cache)
        with pytest.raises(ValueError, match="holds another conversation"):
            model.generate(input_ids=other, attention_mask=other_mask, max_new_tokens=3, cache=cache)

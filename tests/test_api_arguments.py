"""The Python API checks its arguments at the call and names the one that is wrong."""

import math

import pytest

import duocal_runtime as dr

from helpers import random_profile
from runtime_models import tiny_model


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


def test_apply_refuses_a_profile_or_a_non_model():
    model = tiny_model("llama")
    profile = random_profile(layers=2, kv_heads=2, heads=4, head_dim=16)
    with pytest.raises(TypeError, match=r"plan must be a Plan \(make one with dr.plan"):
        dr.apply(model, profile)
    with pytest.raises(TypeError, match="model must be a transformers PreTrainedModel"):
        dr.apply("gpt2", dr.plan(profile, sparsity=0.5))


def test_a_mask_over_only_the_new_tokens_is_refused():
    import torch

    from runtime_models import left_padded_batch

    model = tiny_model("llama")
    ids, _ = left_padded_batch([12])
    with dr.apply(model, dr.uniform_plan(dr.shape_of_config(model.config), dr.Full())) as runtime:
        cache = runtime.new_cache()
        model(input_ids=ids, cache=cache)
        with pytest.raises(ValueError, match="attention_mask covers 1 tokens but the cache and input make 13"):
            model(input_ids=ids[:, :1], attention_mask=torch.ones(1, 1, dtype=torch.long), cache=cache)

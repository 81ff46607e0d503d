"""`DuoCache.load_prefix`: a new cache started from full attention's keys and values of a sequence's first
tokens gives the logits the plan's own cache gives, and refuses what it cannot take."""

import sys

import pytest
import torch

import duocal_runtime as dr
from duocal_runtime.hf.cache import full_attention_kv

from helpers.models import FAMILIES, tiny_model

SINK, RECENT = 2, 6  # the plans' bounded heads see every token before the 8th: a prefix of up to 8 tokens


def mixed_plan(model) -> dr.Plan:
    """Alternate bounded and full heads, starting with a bounded one in layer 0 and a full one in layer 1."""
    shape = dr.shape_of_config(model.config)
    heads = range(shape.num_key_value_heads)
    bounded = dr.SinkWindow(SINK, RECENT)
    return dr.Plan(shape, [[bounded if (h + layer) % 2 == 0 else dr.Full() for h in heads] for layer in range(2)])


def ids(count: int) -> torch.Tensor:
    return torch.randint(1, 97, (2, count), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_loaded_prefix_gives_the_logits_of_the_plans_own_cache(family):
    model, sequence = tiny_model(family), ids(24)
    plan, cut = mixed_plan(model), SINK + RECENT
    assert plan.full_attention_prefix == cut
    prefix = full_attention_kv(model, sequence[:, :cut])
    with torch.no_grad(), dr.apply(model, plan) as runtime:
        own = model(input_ids=sequence, cache=runtime.new_cache()).logits[:, cut:]
        loaded = runtime.new_cache()
        loaded.load_prefix(prefix)
        assert loaded.get_seq_length() == cut
        rest = model(input_ids=sequence[:, cut:], cache=loaded).logits  # past the prefix: bounded heads evict
        decoded = model(input_ids=sequence[:, -1:], cache=loaded).logits  # and a decode step after that
    torch.testing.assert_close(rest, own, rtol=0, atol=5e-5)
    assert loaded.layers[0].groups[0].stored_tokens() == SINK + RECENT
    assert torch.isfinite(decoded).all()


def test_the_prefix_is_copied_not_shared():
    model = tiny_model("llama")
    prefix = full_attention_kv(model, ids(8))
    before = [k.clone() for k, _ in prefix]
    with torch.no_grad(), dr.apply(model, mixed_plan(model)) as runtime:
        for _ in range(2):
            cache = runtime.new_cache()
            cache.load_prefix(prefix)
            model(input_ids=ids(12), cache=cache)
    assert all(torch.equal(k, b) for (k, _), b in zip(prefix, before, strict=True))


def test_a_prefix_longer_than_the_bounded_heads_see_is_refused():
    model = tiny_model("llama")
    prefix = full_attention_kv(model, ids(SINK + RECENT + 1))
    with dr.apply(model, mixed_plan(model)) as runtime, pytest.raises(ValueError, match="full_attention_prefix"):
        runtime.new_cache().load_prefix(prefix)


@pytest.mark.parametrize(
    "policy", [dr.H2O(4, 4), dr.SinkH2O(2, 3, 3), dr.SnapKV(4, 4), dr.Full(kv_bits=8, group=16)], ids=str
)
def test_policies_whose_state_is_more_than_keys_take_no_prefix(policy):
    model = tiny_model("llama")
    shape = dr.shape_of_config(model.config)
    plan = dr.Plan(shape, [[dr.Full(), policy], [dr.Full(), dr.Full()]])
    assert plan.full_attention_prefix == 0
    assert dr.uniform_plan(shape, dr.Full()).full_attention_prefix == sys.maxsize
    prefix = full_attention_kv(model, ids(4))
    with dr.apply(model, plan) as runtime, pytest.raises(ValueError, match="first 0 only"):
        runtime.new_cache().load_prefix(prefix)


def test_only_a_new_dynamic_cache_of_the_right_shape_takes_a_prefix():
    model = tiny_model("llama")
    prefix = full_attention_kv(model, ids(4))
    with torch.no_grad(), dr.apply(model, mixed_plan(model)) as runtime:
        used = runtime.new_cache()
        model(input_ids=ids(3), cache=used)
        with pytest.raises(ValueError, match="new cache"):
            used.load_prefix(prefix)
        with pytest.raises(NotImplementedError, match="static"):
            runtime.new_cache(max_length=32).load_prefix(prefix)
        with pytest.raises(ValueError, match="layers"):
            runtime.new_cache().load_prefix(prefix[:1])
        with pytest.raises(ValueError, match=r"\[B, Hkv, T, D\]"):
            runtime.new_cache().load_prefix([(k[:, :1], v[:, :1]) for k, v in prefix])

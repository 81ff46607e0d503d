"""An all-full plan changes nothing; apply/remove are clean; every family and dtype works."""

import gc
import weakref

import pytest
import torch
from transformers import AttentionInterface, DynamicCache
from transformers.masking_utils import AttentionMaskInterface

import duocal_runtime as dr

from helpers.models import FAMILIES, left_padded_batch, tiny_model
from helpers.models import greedy_with_logits as greedy
from helpers.reference_attention import NAME as REFERENCE
from helpers.reference_attention import DenseReference


def all_full(model) -> dr.Plan:
    return dr.uniform_plan(dr.shape_of_config(model.config), dr.Full())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_all_full_plan_matches_the_model_without_duocal(family):
    model = tiny_model(family)
    ids, mask = left_padded_batch([20, 13, 17])
    ref_tokens, ref_logits = greedy(model, ids, mask)
    with dr.apply(model, all_full(model)) as runtime:
        tokens, logits = greedy(model, ids, mask, runtime.new_cache())
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=2e-5)


def test_sampling_matches_with_the_same_seed(tiny_llama):
    model = tiny_llama
    ids, mask = left_padded_batch([16, 9])
    kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=True, top_k=0, temperature=1.0)
    torch.manual_seed(7)
    ref = model.generate(**kwargs)
    with dr.apply(model, all_full(model)) as runtime:
        torch.manual_seed(7)
        out = model.generate(**kwargs, cache=runtime.new_cache())
    assert torch.equal(out, ref)


def test_bf16_all_full_and_mixed():
    model = tiny_model("llama", dtype=torch.bfloat16)
    ids, mask = left_padded_batch([24, 24])
    ref_tokens, _ = greedy(model, ids, mask)
    shape = dr.shape_of_config(model.config)
    with dr.apply(model, all_full(model)) as runtime:
        tokens, _ = greedy(model, ids, mask, runtime.new_cache())
    assert torch.equal(tokens, ref_tokens)
    plan = dr.Plan(shape, [[dr.SinkWindow(2, 6), dr.H2O(4, 4)], [dr.Full(), dr.SinkH2O(2, 3, 3)]])
    with dr.apply(model, plan) as runtime:
        cache = runtime.new_cache()
        tokens, logits = greedy(model, ids, mask, cache)
    assert all(g.k.dtype == torch.bfloat16 for layer in range(2) for g in cache.head_groups(layer))
    with DenseReference(plan):
        model.set_attn_implementation(REFERENCE)
        reference, ref_logits = greedy(model, ids, mask)
        model.set_attn_implementation("sdpa")
    # bf16 rounding differs from the float64 reference, so a near-tied argmax may flip; until the
    # first step where a row's token differs both runs saw the same history: logits must agree
    same = (tokens[:, ids.shape[1] :] == reference[:, ids.shape[1] :]).long().cumprod(1)  # [B, steps]
    compared = torch.cat([torch.ones_like(same[:, :1]), same[:, :-1]], 1).bool().T  # [steps, B]
    assert compared.sum() >= 4
    torch.testing.assert_close(logits.float()[compared], ref_logits.float()[compared], rtol=0, atol=0.15)


def test_apply_twice_remove_and_apply_another_plan(tiny_llama):
    model = tiny_llama
    ids, mask = left_padded_batch([18])
    before, before_logits = greedy(model, ids, mask)
    impl = model.config._attn_implementation
    shape = dr.shape_of_config(model.config)
    first = dr.apply(model, dr.uniform_plan(shape, dr.SinkWindow(2, 4)))
    streaming, _ = greedy(model, ids, mask, first.new_cache())
    second = dr.apply(model, all_full(model))  # replaces the first
    assert not first.active and second.active
    with pytest.raises(RuntimeError, match="removed"):
        first.new_cache()
    full, _ = greedy(model, ids, mask, second.new_cache())
    assert torch.equal(full, before) and not torch.equal(streaming, before)
    stale = second.new_cache()
    second.remove()
    second.remove()  # idempotent
    for runtime in (first, second):
        assert runtime.name not in AttentionInterface._global_mapping
        assert runtime.name not in AttentionMaskInterface._global_mapping
    assert model.config._attn_implementation == impl
    after, after_logits = greedy(model, ids, mask)
    assert torch.equal(after, before)
    torch.testing.assert_close(after_logits, before_logits, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="removed"):
        model(input_ids=ids, cache=stale)


def test_foreign_cache_is_a_clear_error(tiny_llama):
    model = tiny_llama
    ids, mask = left_padded_batch([12])
    with dr.apply(model, all_full(model)):
        for call in (model, model.generate):  # refused before any work
            with pytest.raises(RuntimeError, match="not a DuoCache"):
                call(input_ids=ids, attention_mask=mask, cache=DynamicCache(config=model.config))


def test_forward_without_cache_uses_the_plan(tiny_llama):
    model = tiny_llama
    ids, mask = left_padded_batch([30, 22])
    shape = dr.shape_of_config(model.config)
    plan = dr.Plan(shape, [[dr.SinkWindow(2, 5), dr.Full()], [dr.H2O(3, 3), dr.Full()]])
    with dr.apply(model, plan) as runtime:
        no_cache = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        with_cache = model(input_ids=ids, attention_mask=mask, cache=runtime.new_cache()).logits
    plain = model(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(no_cache[real], with_cache[real], rtol=0, atol=1e-5)
    assert not torch.allclose(no_cache[real], plain[real], atol=1e-3)


def test_unsupported_models_and_shapes_are_clear_errors(tiny_llama):
    from transformers import GPT2Config, GPT2LMHeadModel, MistralConfig, MistralForCausalLM

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    shape = dr.ModelShape(1, 2, 2, 16)
    with pytest.raises(ValueError, match="does not support model type 'gpt2'"):
        dr.apply(gpt2, dr.uniform_plan(shape, dr.Full()))
    windowed = MistralForCausalLM(
        MistralConfig(
            num_hidden_layers=1,
            hidden_size=32,
            num_attention_heads=2,
            num_key_value_heads=2,
            intermediate_size=32,
            vocab_size=50,
            sliding_window=16,
        )
    )
    with pytest.raises(ValueError, match="sliding-window"):
        dr.apply(windowed, dr.uniform_plan(shape, dr.Full()))
    model = tiny_llama
    with pytest.raises(dr.PlanError, match=r"plan is for 3 layers x 2 KV heads.*model has 2 layers x 2 KV heads"):
        dr.apply(model, dr.uniform_plan(dr.ModelShape(3, 4, 2, 16), dr.Full()))
    with pytest.raises(dr.PlanError, match="prefill_chunk_size"):
        dr.apply(model, all_full(model), prefill_chunk_size=0)
    with pytest.raises(dr.PlanError, match="positive integer"):
        dr.SinkWindow(sink=4, recent=0)
    with pytest.raises(dr.PlanError, match="positive integer"):
        dr.H2O(heavy=-1, recent=4)


def test_reset_cache_gives_a_fresh_start(tiny_llama):
    model = tiny_llama
    ids, mask = left_padded_batch([14, 10])
    plan = dr.Plan(dr.shape_of_config(model.config), [[dr.SinkWindow(2, 4), dr.H2O(3, 3)]] * 2)
    with dr.apply(model, plan) as runtime:
        cache = runtime.new_cache()
        first, _ = greedy(model, ids, mask, cache)
        cache.reset()
        assert cache.get_seq_length() == 0 and cache.kv_bytes() == 0
        again, _ = greedy(model, ids, mask, cache)
    assert torch.equal(first, again)


def test_a_dropped_model_is_freed_and_unregistered():
    model = tiny_model("llama")  # its own, not the fixture's: the test drops the last reference
    runtime = dr.apply(model, all_full(model))  # never removed
    name, alive = runtime.name, weakref.ref(model)
    assert name in AttentionInterface._global_mapping
    del model, runtime
    gc.collect()
    assert alive() is None
    assert name not in AttentionInterface._global_mapping and name not in AttentionMaskInterface._global_mapping


def test_a_cache_used_by_attention_that_is_not_its_runtimes_is_refused(tiny_llama):
    """Another model given this runtime's cache, or the model switched to sdpa while the runtime is
    applied, would attend to nothing duocal stored (it generated '88888' for '8EVFK'): refused."""
    a, b = tiny_llama, tiny_model("llama", seed=1)
    ids, mask = left_padded_batch([12])
    with dr.apply(a, all_full(a)) as runtime:
        with pytest.raises(RuntimeError, match=r"not its duocal runtime's.*'sdpa'"):
            b.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, cache=runtime.new_cache())
        a.set_attn_implementation("sdpa")
        for call in (
            lambda: a.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3),
            lambda: a(input_ids=ids, attention_mask=mask, cache=runtime.new_cache()),
        ):
            with pytest.raises(RuntimeError, match="not its duocal runtime's"):
                call()


def test_nested_apply_blocks_bring_the_outer_plan_back(tiny_llama):
    model = tiny_llama
    ids, mask = left_padded_batch([18])
    plain, _ = greedy(model, ids, mask)
    shape = dr.shape_of_config(model.config)
    with dr.apply(model, dr.uniform_plan(shape, dr.SinkWindow(2, 4))) as outer:
        streaming, _ = greedy(model, ids, mask)  # the drop-in cache of the outer plan
        with dr.apply(model, all_full(model)) as inner:
            assert inner.active and not outer.active
            full, _ = greedy(model, ids, mask)
        assert outer.active and not inner.active  # the inner block ended: the outer plan serves again
        again, _ = greedy(model, ids, mask, outer.new_cache())
        assert torch.equal(again, streaming) and torch.equal(greedy(model, ids, mask)[0], streaming)
    assert not outer.active and torch.equal(full, plain) and not torch.equal(streaming, plain)
    assert torch.equal(greedy(model, ids, mask)[0], plain)


def test_a_suspended_runtime_removed_inside_the_inner_block_stays_removed(tiny_llama):
    model = tiny_llama
    shape = dr.shape_of_config(model.config)
    impl = model.config._attn_implementation
    with dr.apply(model, dr.uniform_plan(shape, dr.SinkWindow(2, 4))) as outer:
        with dr.apply(model, all_full(model)):
            outer.remove()
        assert not outer.active
    assert model.config._attn_implementation == impl

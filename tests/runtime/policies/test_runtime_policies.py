"""Each policy keeps exactly what it should and attends exactly as a dense masked reference."""

import pytest
import torch
from transformers import DynamicCache

import duocal_runtime as dr
from duocal_runtime.policies.full import full_slots

from helpers.models import drive_decode, left_padded_batch, padded_decode_steps, tiny_model
from helpers.models import greedy_with_logits as run
from helpers.policy_matrix import policy_matrix
from helpers.reference_attention import NAME, DenseReference, runtime_kept_ranks

MIXED = [
    [dr.SinkWindow(3, 5), dr.H2O(4, 3)],
    [dr.SinkH2O(2, 3, 4), dr.Full()],
]


def reference_run(model, plan, ids, mask, steps):
    previous = model.config._attn_implementation
    with DenseReference(plan) as reference:
        model.set_attn_implementation(NAME)
        try:
            tokens, logits = run(model, ids, mask, None, steps)
        finally:
            model.set_attn_implementation(previous)
    return tokens, logits, reference


@pytest.mark.parametrize("family", ["llama", "llama_mha", "qwen3"])
@pytest.mark.parametrize("lengths", [[6], [21], [14, 9]], ids=["short-prompt", "long-prompt", "left-padded"])
def test_mixed_plan_matches_dense_reference_step_by_step(family, lengths):
    model = tiny_model(family)
    shape = dr.shape_of_config(model.config)
    table = MIXED if shape.num_key_value_heads == 2 else [row + row for row in MIXED]
    plan = dr.Plan(shape, table)
    ids, mask = left_padded_batch(lengths)
    steps = 16  # crosses every budget (sink+recent = 8, heavy+recent = 7 or 9) during decode
    ref_tokens, ref_logits, reference = reference_run(model, plan, ids, mask, steps)
    with dr.apply(model, plan) as runtime:
        cache = runtime.new_cache()
        tokens, logits = run(model, ids, mask, cache, steps)
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-4)
    assert torch.equal(tokens, ref_tokens)
    for layer, row in enumerate(table):
        for kvh, policy in enumerate(row):
            if isinstance(policy, (dr.H2O, dr.SinkH2O)):
                for b in range(len(lengths)):
                    assert runtime_kept_ranks(cache, layer, b, kvh) == reference.kept_ranks(layer, b, kvh)


def test_sink_window_keeps_exactly_sink_and_recent(tiny_llama):
    model = tiny_llama
    shape = dr.shape_of_config(model.config)
    plan = dr.uniform_plan(shape, dr.SinkWindow(4, 6))
    ids, mask = left_padded_batch([25, 7])
    with dr.apply(model, plan) as runtime:
        cache = runtime.new_cache()
        model(input_ids=ids, attention_mask=mask, cache=cache)
        for layer in range(2):
            assert runtime_kept_ranks(cache, layer, 0, 0) == {0, 1, 2, 3} | set(range(19, 25))
            assert runtime_kept_ranks(cache, layer, 1, 1) == set(range(7))
        cache = runtime.new_cache()
        run(model, ids, mask, cache, 9)
        real = [25 + 8, 7 + 8]  # the last generated token is never fed back
        for b, n in enumerate(real):
            want = set(range(4)) | set(range(n - 6, n))
            assert runtime_kept_ranks(cache, 1, b, 0) == want


@pytest.mark.parametrize("policy", policy_matrix(bits=16))
@pytest.mark.parametrize("decode", [0, 20])
def test_stored_bytes_equal_the_analytic_size(policy, decode, tiny_llama):
    model = tiny_llama
    shape = dr.shape_of_config(model.config)
    plan = dr.uniform_plan(shape, policy)
    ids, mask = left_padded_batch([30, 30])
    with dr.apply(model, plan) as runtime:
        cache = runtime.new_cache()
        run(model, ids, mask, cache, decode + 1)
    seen = 30 + decode
    per_token = 2 * shape.head_dim * 4 * 2 * shape.num_key_value_heads * shape.num_hidden_layers  # K+V, fp32, B=2
    if isinstance(policy, dr.Full):
        slots = full_slots(30, first=True) if decode == 0 else None
        if slots is None:
            slots = 30
            while slots < seen:
                slots = full_slots(slots + 1, first=False)
        assert cache.kv_bytes() == slots * per_token
        assert cache.kv_bytes() <= 1.27 * seen * per_token  # tiny contexts: at least 8 slots of slack
    else:
        assert cache.kv_bytes() == min(seen, policy.capacity) * per_token
    assert cache.kv_bytes() <= plan.kv_bytes(seen, batch=2, dtype="float32") * (1.27 if decode else 1)


def test_mixed_plan_bytes_and_padding_never_stored(tiny_llama):
    model = tiny_llama
    shape = dr.shape_of_config(model.config)
    plan = dr.Plan(shape, MIXED)
    ids, mask = left_padded_batch([5, 3])  # shorter than every budget
    with dr.apply(model, plan) as runtime:
        cache = runtime.new_cache()
        model(input_ids=ids, attention_mask=mask, cache=cache)
    stored = {g.policy.name: g.stored_tokens() for layer in range(2) for g in cache.head_groups(layer)}
    assert stored == {"sink_window": 5, "h2o": 5, "sink_h2o": 5, "full": 5}
    assert runtime_kept_ranks(cache, 0, 1, 0) == {0, 1, 2}
    assert runtime_kept_ranks(cache, 0, 1, 1) == {0, 1, 2}


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
def test_left_padded_batch_equals_rows_run_alone(family):
    model = tiny_model(family)
    plan = dr.Plan(dr.shape_of_config(model.config), MIXED)
    lengths = [21, 12, 16]
    ids, mask = left_padded_batch(lengths)
    with dr.apply(model, plan) as runtime:
        batch, _ = run(model, ids, mask, runtime.new_cache(), 14)
        for row, n in enumerate(lengths):
            alone, _ = run(model, ids[row : row + 1, -n:], None, runtime.new_cache(), 14)
            assert torch.equal(alone[0, n:], batch[row, ids.shape[1] :])


def test_follow_up_turn_on_a_reused_cache(tiny_llama):
    model = tiny_llama
    shape = dr.shape_of_config(model.config)
    ids, _ = left_padded_batch([20])
    follow = torch.randint(1, 97, (1, 7), generator=torch.Generator().manual_seed(3))
    for plan in (dr.uniform_plan(shape, dr.Full()), dr.Plan(shape, [[dr.SinkWindow(3, 6), dr.Full()]] * 2)):
        with dr.apply(model, plan) as runtime:
            cache = runtime.new_cache()
            turn1 = model.generate(input_ids=ids, max_new_tokens=6, do_sample=False, cache=cache)
            conversation = torch.cat([turn1, follow], dim=1)
            turn2 = model.generate(input_ids=conversation, max_new_tokens=6, do_sample=False, cache=cache)
            fresh = model.generate(input_ids=conversation, max_new_tokens=6, do_sample=False, cache=runtime.new_cache())
        assert cache.get_seq_length() == conversation.shape[1] + 5
        assert torch.equal(turn2, fresh)


def test_chunked_prefill_same_output_and_bounded_h2o(tiny_llama):
    model = tiny_llama
    shape = dr.shape_of_config(model.config)
    ids, mask = left_padded_batch([40, 33])
    plan = dr.Plan(shape, [[dr.SinkWindow(3, 6), dr.Full()]] * 2)
    with dr.apply(model, plan) as runtime:
        whole = model(input_ids=ids, attention_mask=mask, cache=runtime.new_cache()).logits
    with dr.apply(model, plan, prefill_chunk_size=7) as runtime:
        chunked = model(input_ids=ids, attention_mask=mask, cache=runtime.new_cache()).logits
    real = mask.bool()
    torch.testing.assert_close(chunked[real], whole[real], rtol=0, atol=1e-5)
    with dr.apply(model, plan) as runtime:  # transformers' own chunked prefill: successive forward passes
        one_pass, _ = run(model, ids, mask, runtime.new_cache(), 6)
        hf_chunks = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=6,
            do_sample=False,
            cache=runtime.new_cache(),
            prefill_chunk_size=9,
        )
    assert torch.equal(one_pass, hf_chunks)
    h2o = dr.uniform_plan(shape, dr.H2O(4, 4))
    with dr.apply(model, h2o, prefill_chunk_size=8) as runtime:
        cache = runtime.new_cache()
        model(input_ids=ids, attention_mask=mask, cache=cache)
    assert all(g.stored_tokens() == 8 for layer in range(2) for g in cache.head_groups(layer))


def test_runtime_kept_sets_use_original_positions(tiny_llama):
    """Keys are cached after RoPE: the kept rank set after eviction is not renumbered."""
    model = tiny_llama
    plan = dr.uniform_plan(dr.shape_of_config(model.config), dr.SinkWindow(2, 3))
    ids, _ = left_padded_batch([12])
    with dr.apply(model, plan) as runtime:
        cache = runtime.new_cache()
        model.generate(input_ids=ids, max_new_tokens=4, do_sample=False, cache=cache)
    assert runtime_kept_ranks(cache, 0, 0, 0) == {0, 1, 12, 13, 14}
    assert cache.get_seq_length() == 15


def test_decode_steps_whose_new_token_is_padding_match_the_reference(tiny_llama):
    """Rows can feed padding mid-generation (a 0 in the attention mask): bounded heads skip it."""
    model = tiny_llama
    plan = dr.Plan(dr.shape_of_config(model.config), MIXED)
    ids, mask = left_padded_batch([14, 9])
    tokens, new_mask = padded_decode_steps(8, padded=(3, 4))

    def drive(cache):
        return drive_decode(model, ids, mask, cache, tokens, new_mask)

    with DenseReference(plan) as reference:
        model.set_attn_implementation(NAME)
        expected = drive(DynamicCache(config=model.config))
        model.set_attn_implementation("sdpa")
    with dr.apply(model, plan) as runtime:
        cache = runtime.new_cache()
        got = drive(cache)
    real = torch.ones(2, 9, dtype=torch.bool)
    real[1, 4:6] = False  # outputs at padding positions are unused
    torch.testing.assert_close(got[real], expected[real], rtol=0, atol=1e-4)
    for layer, row in enumerate(MIXED):
        for kvh, policy in enumerate(row):
            if isinstance(policy, (dr.H2O, dr.SinkH2O)):
                for b in range(2):
                    assert runtime_kept_ranks(cache, layer, b, kvh) == reference.kept_ranks(layer, b, kvh)

"""snapkv: the kept set equals a selection computed by hand (the last queries' attention, pooled in
rank order, top `selected` before the window), its bytes are its budget, and it runs under
generate() with left padding, static and dynamic alike, and through continuous batching."""

import pytest
import torch
import torch.nn.functional as F
from transformers import ContinuousBatchingConfig, GenerationConfig

import duocal_runtime as dr
from duocal_runtime.attention.ranks import ranks_of_new_tokens
from duocal_runtime.policies.base import Step

from helpers.models import left_padded_batch


def by_hand(q, k, selected: int, observed: int, scaling: float) -> set[int]:
    """One row, one KV head with R query heads: q [R, T, D], k [T, D], keys in rank order 0..T-1."""
    t = k.shape[0]
    last = torch.arange(t - observed, t)
    logits = (q[:, last] @ k.T) * scaling  # [R, W, T]
    logits = logits.masked_fill(torch.arange(t)[None, None, :] > last[None, :, None], float("-inf"))
    mass = logits.softmax(-1).sum((0, 1))  # [T]
    pooled = F.avg_pool1d(mass[None, None], 5, stride=1, padding=2, count_include_pad=False)[0, 0]
    before = pooled[: t - observed]
    return set(before.topk(selected).indices.tolist()) | set(range(t - observed, t))


def test_the_kept_set_is_the_selection_by_hand():
    torch.manual_seed(0)
    policy = dr.SnapKV(selected=6, window=4)
    group = policy.make_group([0, 1], rep=2)
    t, d = 40, 8
    q, k, v = torch.randn(1, 4, t, d), torch.randn(1, 2, t, d), torch.randn(1, 2, t, d)
    valid = torch.ones(1, t, dtype=torch.bool)
    ranks = ranks_of_new_tokens(valid, torch.zeros(1, dtype=torch.long))
    group.attend(q, k, v, Step(0, valid, ranks, torch.tensor([t]), None, 0.3))
    for head in range(2):
        want = by_hand(q[0, 2 * head : 2 * head + 2], k[0, head], 6, 4, 0.3)
        assert group.kept_ranks(0, head) == want
    assert group.stored_tokens() == policy.capacity == 10


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_generate_with_left_padding_holds_its_budget(static, tiny_llama):
    model = tiny_llama
    shape = dr.shape_of_config(model.config)
    plan = dr.Plan(shape, [[dr.SnapKV(6, 4), dr.Full()], [dr.SnapKV(8, 4), dr.SinkWindow(2, 6)]])
    ids, mask = left_padded_batch([30, 19])
    with dr.apply(model, plan) as runtime:
        dynamic = runtime.new_cache()
        want = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, cache=dynamic)
        cache = runtime.new_cache(max_length=36) if static else runtime.new_cache()
        got = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, cache=cache)
    assert torch.equal(got, want)
    groups = [g for layer in range(2) for g in dynamic.head_groups(layer) if g.policy.name == "snapkv"]
    assert all(g.stored_tokens() <= g.policy.capacity + 1 for g in groups)  # +1: the decode step's new token
    assert all(len(g.kept_ranks(row, 0)) == g.policy.capacity for g in groups for row in (0, 1))


def test_snapkv_through_continuous_batching_equals_generate(tiny_llama):
    model = tiny_llama
    plan = dr.Plan(dr.shape_of_config(model.config), [[dr.SnapKV(6, 4), dr.Full()], [dr.Full(), dr.SnapKV(5, 3)]])
    prompts = [torch.randint(1, 97, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (25, 41, 9)]
    gen = GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=-1, pad_token_id=0)
    with dr.apply(model, plan) as runtime:
        want = []
        for p in prompts:
            out = model.generate(
                input_ids=torch.tensor([p]), max_new_tokens=8, do_sample=False, cache=runtime.new_cache()
            )
            want.append(out[0, len(p) :].tolist())
        got = model.generate_batch(
            inputs=prompts,
            generation_config=gen,
            continuous_batching_config=ContinuousBatchingConfig(num_blocks=64, max_batch_tokens=128),
        )
    assert [r.generated_tokens for r in got.values()] == want


def test_a_profile_deploys_and_plans_snapkv_by_its_own_fields():
    from helpers.profiles import random_profile

    profile = random_profile(layers=2, kv_heads=2, heads=4, head_dim=16).with_deploy(dr.SnapKV(20, 8), policy="snapkv")
    plan = dr.plan(dr.profile_from_dict(profile.to_dict()), sparsity=0.5)
    assert {p for row in plan.policies for p in row} == {dr.Full(), dr.SnapKV(20, 8)}
    assert plan.kv_tokens(100) == 2 * 100 + 2 * 28


def test_a_first_unpadded_pass_attends_as_the_rank_masked_path_does(tiny_llama):
    """A first pass without padding attends causally through sdpa; the same tokens beside a padded
    row (each head's ranks masking) give the same outputs and the same kept set."""
    model = tiny_llama
    plan = dr.uniform_plan(dr.shape_of_config(model.config), dr.SnapKV(selected=6, window=4))
    ids, mask = left_padded_batch([30, 24])
    with dr.apply(model, plan) as runtime, torch.no_grad():
        alone_cache, padded_cache = runtime.new_cache(), runtime.new_cache()
        alone = model(input_ids=ids[:1], cache=alone_cache).logits[0]
        padded = model(input_ids=ids, attention_mask=mask, cache=padded_cache).logits[0]
    torch.testing.assert_close(alone, padded, rtol=0, atol=1e-5)
    for layer in range(2):
        a, p = alone_cache.head_groups(layer)[0], padded_cache.head_groups(layer)[0]
        assert all(a.kept_ranks(0, h) == p.kept_ranks(0, h) for h in range(a.num_kv))

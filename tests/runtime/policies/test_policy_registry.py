"""Adding a policy takes one class with `@register_policy` and its head group: this file defines
one (the first token plus the last `recent`, unpadded batches) and runs it through plans,
profiles' deploy defaults, memory reports and generate(), without touching the runtime."""

import json
from dataclasses import dataclass

import pytest
import torch

import duocal_runtime as dr
from duocal_runtime.attention import ranks as R
from duocal_runtime.policies import POLICIES, HeadGroup

from helpers.models import left_padded_batch
from helpers.profiles import random_profile


@dataclass(frozen=True)
class FirstAndRecent(dr.HeadPolicy):
    name = "first_and_recent"
    recent: int = 8

    @property
    def capacity(self) -> int:
        return 1 + self.recent

    def keeps(self, k_rank, real_total, score=None):
        return R.in_sink_or_recent(k_rank, real_total[..., None] - 1, 1, self.recent)

    def make_group(self, kv_heads, rep, max_length=None):
        return FirstAndRecentGroup(self, kv_heads, rep)


class FirstAndRecentGroup(HeadGroup):
    """Keeps every token in order and drops those outside the policy after each pass."""

    def attend(self, q, k, v, step):
        keys = k if self.k is None else torch.cat([self.k, k], dim=2)
        values = v if self.v is None else torch.cat([self.v, v], dim=2)
        ranks = step.new_ranks if self.k is None else torch.cat([self.rank, step.new_ranks], dim=1)
        mask = dr.SinkWindow(1, self.policy.recent).sees(step.new_ranks[:, :, None], ranks[:, None, :])[:, None]
        out = torch.nn.functional.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=step.scaling, enable_gqa=True
        )
        keep = self.policy.keeps(ranks, step.real_after)[0]  # one unpadded row
        self.k, self.v, self.rank = keys[:, :, keep], values[:, :, keep], ranks[:, keep]
        return out

    def fill(self, batch, context, head_dim, dtype, device):
        raise NotImplementedError


@pytest.fixture
def registered():
    dr.register_policy(FirstAndRecent)
    yield FirstAndRecent
    POLICIES.pop(FirstAndRecent.name)


def test_a_policy_defined_in_a_test_file_runs_under_generate(registered, tiny_llama):
    model = tiny_llama
    profile = random_profile(layers=2, kv_heads=2, heads=4, head_dim=16)
    plan = dr.plan(profile, sparsity=0.5, policy="first_and_recent", recent=5)
    assert {p for row in plan.policies for p in row} == {dr.Full(), FirstAndRecent(5)}
    assert plan.kv_tokens(100) == 2 * 100 + 2 * 6  # planning asks the policy for its size
    same_rule = dr.Plan(plan.shape, [[dr.SinkWindow(1, 5) if p.bounded else p for p in row] for row in plan.policies])
    ids, _ = left_padded_batch([30])
    tokens = []
    for each in (plan, same_rule):
        with dr.apply(model, each) as runtime:
            cache = runtime.new_cache()
            tokens.append(model.generate(input_ids=ids, max_new_tokens=12, do_sample=False, cache=cache))
            groups = [g for layer in range(2) for g in cache.head_groups(layer) if g.policy.bounded]
            assert all(g.kept_ranks(0, 0) == {0, *range(36, 41)} for g in groups)
    assert torch.equal(tokens[0], tokens[1])


def test_profiles_accept_a_registered_policy_as_deploy_default(registered):
    profile = random_profile(layers=2, kv_heads=2, heads=4, head_dim=16)
    data = profile.to_dict()
    data["deploy"]["policy"] = "first_and_recent"
    data["deploy"]["sizes"]["first_and_recent"] = {"recent": 7}  # its own field, stored with no edit elsewhere
    with_toy = dr.profile_from_dict(json.loads(json.dumps(data)))
    plan = dr.plan(with_toy, sparsity=1.0)
    assert all(p == FirstAndRecent(recent=7) for row in plan.policies for p in row)
    assert dr.profile_from_dict(with_toy.to_dict()) == with_toy


def test_the_profiler_measures_a_registered_policy_by_its_own_rule(registered):
    from duocal.profiling.head_scores import kept_keys

    kept = kept_keys(FirstAndRecent(recent=3), row=9, column_mass=torch.rand(2, 12))
    assert kept.shape == (2, 12)
    assert [torch.nonzero(k).flatten().tolist() for k in kept] == [[0, 7, 8, 9]] * 2  # never keys after the row

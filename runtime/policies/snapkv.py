"""`snapkv`: at the end of each prefill, a head keeps the `selected` earlier tokens its last `window`
queries attend to most, plus the last `window` tokens.

SnapKV (Li et al., NeurIPS 2024, arXiv 2404.14469): the observation window's attention, summed over
the group's query heads and those queries, is average-pooled along the keys (kernel 5, as the
reference's default) so neighbours of an important token come with it; the top `selected` earlier
tokens are kept. Query-aware: it chooses by what the end of the prompt asks, so a question asked
after the context is compressed finds only what the context's own end looked at.

Here it then behaves as a fixed capacity (the reference lets decode tokens grow the cache): the last
`window` tokens stay, a token that leaves the observation window is evicted unless it was selected, and the
selection is redone at the end of every prefill pass (a follow-up turn re-selects among what is
kept). Storage and decode are the h2o groups' (one slot per evicted token, no copies).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..attention import dense as DA
from ..attention import ranks as R
from ..attention.scored import attention_with_mass
from .base import Step, register_policy
from .heavy_hitters import H2OGroup, HeavyHitterPolicy, StaticH2OGroup

POOL_KERNEL = 5  # the SnapKV reference's default average pooling of observation window attention along keys
PINNED = float("inf")  # the score of a selected token: never evicted until the next selection


@register_policy
@dataclass(frozen=True)
class SnapKV(HeavyHitterPolicy):
    name = "snapkv"
    selected: int = 96
    window: int = 32

    @classmethod
    def keeping(cls, capacity: int) -> SnapKV:
        """SnapKV keeping `capacity` tokens per head: an observation window of 32 (a quarter of a
        capacity under 128), the rest selected."""
        observation_window = max(1, min(32, capacity // 4))
        return cls(selected=capacity - observation_window, window=observation_window)

    def protected(self, k_rank, real_total):
        """The last `window` real tokens (the observation window of the next selection)."""
        return R.in_sink_or_recent(k_rank, real_total[..., None] - 1, 0, self.window)

    def priority(self, score, k_rank, real_total):
        """Selected and observation window tokens first (+inf), then newer before older, empty slots last (-inf)."""
        keep = (score == PINNED) | self.protected(k_rank, real_total)
        prio = torch.where(keep, torch.full_like(score, PINNED), k_rank.to(score.dtype))
        return torch.where(k_rank >= 0, prio, torch.full_like(score, float("-inf")))

    def keeps(self, k_rank, real_total, score=None):
        """With `score` as the observation window's pooled attention: it and the top `selected` before it."""
        if score is None:
            raise ValueError("snapkv keeps tokens by the observation window's attention: pass score")
        observation_window = self.protected(k_rank, real_total)
        candidates = (k_rank >= 0) & ~observation_window
        ranked = score.masked_fill(~candidates, float("-inf"))
        count = min(self.selected, int(candidates.sum(-1).max()))
        chosen = torch.zeros_like(observation_window)
        if count:
            chosen.scatter_(-1, ranked.topk(count, dim=-1).indices, True)
        return observation_window | (chosen & candidates)

    def make_group(self, kv_heads, rep, max_length=None):
        return SnapKVGroup(self, kv_heads, rep) if max_length is None else StaticSnapKVGroup(self, kv_heads, rep)


def pooled_in_rank_order(mass: torch.Tensor, k_rank: torch.Tensor) -> torch.Tensor:
    """Average-pool `mass` [B, G, S] along keys in the order of their ranks (slots are unordered)."""
    order = torch.where(k_rank >= 0, k_rank, torch.iinfo(k_rank.dtype).max).argsort(-1)
    b, g, s = mass.shape
    ordered = mass.gather(-1, order).reshape(b * g, 1, s)
    pooled = F.avg_pool1d(ordered, POOL_KERNEL, stride=1, padding=POOL_KERNEL // 2, count_include_pad=False)
    return torch.empty_like(mass).scatter_(-1, order, pooled.reshape(b, g, s))


class SnapKVGroup(H2OGroup):
    """h2o's storage and decode; the scores are the selection (`PINNED` for a selected token)."""

    policy: SnapKV

    def _attend_and_score(self, q, keys, values, step: Step):
        if self._first_unpadded_pass(q, keys, step):  # plain causal attention
            out = DA.sdpa(q, keys, values, None, step.scaling, causal=True)
        else:  # earlier slots or padding: each head's own ranks decide what a query sees
            out, _ = attention_with_mass(q, keys, values, step.new_ranks, self.rank, step.scaling)
        self.score = self._selection(q, keys, values, step)
        return out

    def _selection(self, q, keys, values, step: Step) -> torch.Tensor:
        """Scores after this pass: PINNED for the `selected` tokens the last `window` queries chose."""
        w = min(self.policy.window, q.shape[2])
        q_rank = step.new_ranks[:, -w:]  # [B, W]; rows are left padded, so the pass ends with real tokens
        visible = DA.expand_mask_over_heads(R.causal_rank_mask(q_rank[:, None], self.rank), q.shape[1] // self.num_kv)
        _, probs = DA.attention(
            DA.gqa_queries(q[:, :, -w:], self.num_kv), keys, values, visible, step.scaling, want_probs=True
        )
        mass = pooled_in_rank_order(probs.sum(2), self.rank)  # [B, G, S]
        chosen = self.policy.keeps(self.rank, step.real_after[:, None], mass)
        return torch.where(chosen & ~self.policy.protected(self.rank, step.real_after[:, None]), PINNED, 0.0)


class StaticSnapKVGroup(SnapKVGroup, StaticH2OGroup):
    """`capacity` fixed slots per head (the h2o static group's), SnapKV's selection."""

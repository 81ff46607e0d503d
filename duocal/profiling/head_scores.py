"""Per-head measures from recorded attention: pure functions of probability rows and column mass.

For a query at position r and one KV head (its R query heads):

- retrieval: probability mass on the queried needle's tokens, mean over the R query heads
  (Wu et al.'s retrieval score, arXiv 2404.15574, in [0, 1]);
- kept share of a policy: probability mass on the keys that policy would still hold when r is
  answered — `sink_window`: the first `sink` and the last `recent`; `h2o`: the last `recent` and
  the `heavy` earlier keys with the most accumulated attention (column mass summed over the
  group's query heads, as the h2o policy scores them); `sink_h2o`: the first `sink` too;
  `snapkv`: the tokens its rule selected at the end of each prefill pass (the pass's last
  `window` queries' attention, summed over the group's query heads and pooled as the runtime
  pools it) plus the last `window` keys. Where the passes end is the protocol: the prompt's end
  when the question is prefilled with the context, the context's end and then the question's
  when it comes after. Attention is the full model's (the selection a head would make were every
  other head full).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

import duocal_runtime as dr
from duocal_runtime.policies.snapkv import pooled_in_rank_order


def kept_keys(policy: dr.HeadPolicy, row: int, column_mass: torch.Tensor) -> torch.Tensor:
    """[G, T] bool: the keys each KV head holds when the query at `row` attends (keys <= row), by
    the policy's own rule (`HeadPolicy.keeps`) with the column mass as accumulated attention."""
    g, t = column_mass.shape
    keys = torch.arange(t, device=column_mass.device)
    ranks = torch.where(keys <= row, keys, -1).expand(g, t)
    return policy.keeps(ranks, torch.full((g,), row + 1, device=column_mass.device), column_mass)


def selected_by_passes(policy: dr.SnapKV, pass_ends: Sequence[int], observation_mass: Mapping[int, torch.Tensor]):
    """[G, T] bool: what a snapkv head holds after prefill passes ending at `pass_ends` (increasing),
    each selecting by `observation_mass[end]` [G, T] (its last `window` queries' attention) among the
    tokens still held and the pass's own, by the policy's rule and the runtime's pooling."""
    previous, held = 0, None
    for end in pass_ends:
        mass = observation_mass[end]
        keys = torch.arange(mass.shape[-1], device=mass.device).expand_as(mass)
        present = (keys >= previous) & (keys < end)  # this pass's tokens
        present = present if held is None else present | held
        ranks = torch.where(present, keys, -1)
        score = pooled_in_rank_order((mass * present)[None], ranks[None])[0]
        held = policy.keeps(ranks, torch.full(mass.shape[:1], end, device=mass.device), score) & present
        previous = end
    return held


def snapkv_kept(policy: dr.SnapKV, row: int, held: torch.Tensor, last_end: int) -> torch.Tensor:
    """[G, T] bool at the query `row` (>= `last_end` - 1, the last pass's end): what the last pass
    selected (its observation window leaves as decode goes on) plus the last `window` keys."""
    keys = torch.arange(held.shape[-1], device=held.device)
    ranks = torch.where(keys <= row, keys, -1).expand_as(held)
    selected = held & (keys < last_end - policy.window)
    return selected | policy.protected(ranks, torch.full(held.shape[:1], row + 1, device=held.device))


def kept_share(policy_keeps, rows: list[int], probs: torch.Tensor) -> torch.Tensor:
    """probs [H, A, T] (rows of the positions `rows`), `policy_keeps(row)` -> [G, T] bool: [G], mean kept mass."""
    shares = []
    for a, row in enumerate(rows):
        kept = policy_keeps(row)  # [G, T]
        g = kept.shape[0]
        per_head = (probs[:, a] * kept.repeat_interleave(probs.shape[0] // g, dim=0)).sum(-1)  # [H]
        shares.append(per_head.view(g, -1).mean(-1))
    return torch.stack(shares).mean(0)


def retrieval_score(probs: torch.Tensor, spans: list[tuple[int, int]], groups: int) -> torch.Tensor:
    """probs [H, A, T], spans[a] = the needle [start, end) row a answers about -> [G] in [0, 1]."""
    mass = torch.stack([probs[:, a, start:end].sum(-1) for a, (start, end) in enumerate(spans)], dim=1)  # [H, A]
    return mass.mean(1).view(groups, -1).mean(-1)

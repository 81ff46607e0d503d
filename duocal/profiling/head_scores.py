"""Per-head measures from recorded attention: pure functions of probability rows and column mass.

For a query at position r and one KV head (its R query heads):

- retrieval: probability mass on the queried needle's tokens, mean over the R query heads
  (Wu et al.'s retrieval score, arXiv 2404.15574, in [0, 1]);
- kept share of a policy: probability mass on the keys that policy would still hold when r is
  answered — `sink_window`: the first `sink` and the last `recent`; `h2o`: the last `recent` and
  the `heavy` earlier keys with the most accumulated attention (column mass summed over the
  group's query heads, as the h2o policy scores them); `sink_h2o`: the first `sink` too.
"""

from __future__ import annotations

import torch

import duocal_runtime as dr


def kept_keys(policy: dr.HeadPolicy, row: int, column_mass: torch.Tensor) -> torch.Tensor:
    """[G, T] bool: the keys each KV head holds when the query at `row` attends (keys <= row), by
    the policy's own rule (`HeadPolicy.keeps`) with the column mass as accumulated attention."""
    g, t = column_mass.shape
    keys = torch.arange(t, device=column_mass.device)
    ranks = torch.where(keys <= row, keys, -1).expand(g, t)
    return policy.keeps(ranks, torch.full((g,), row + 1, device=column_mass.device), column_mass)


def kept_share(policy: dr.HeadPolicy, rows: list[int], probs: torch.Tensor, column_mass: torch.Tensor) -> torch.Tensor:
    """probs [H, A, T] (rows of the positions `rows`), column_mass [G, T] -> [G]: mean kept mass."""
    g = column_mass.shape[0]
    shares = []
    for a, row in enumerate(rows):
        kept = kept_keys(policy, row, column_mass)  # [G, T]
        per_head = (probs[:, a] * kept.repeat_interleave(probs.shape[0] // g, dim=0)).sum(-1)  # [H]
        shares.append(per_head.view(g, -1).mean(-1))
    return torch.stack(shares).mean(0)


def retrieval_score(probs: torch.Tensor, spans: list[tuple[int, int]], groups: int) -> torch.Tensor:
    """probs [H, A, T], spans[a] = the needle [start, end) row a answers about -> [G] in [0, 1]."""
    mass = torch.stack([probs[:, a, start:end].sum(-1) for a, (start, end) in enumerate(spans)], dim=1)  # [H, A]
    return mass.mean(1).view(groups, -1).mean(-1)

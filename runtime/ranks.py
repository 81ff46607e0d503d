"""Token ranks and slot selection: pure tensor functions behind the per-head storage.

Shapes: B batch, G KV heads of a group, R query heads per KV head, T new tokens, S keys.
A *rank* is a token's index among the real (unpadded) tokens of its row: 0 for the first real
token. Empty cache slots and padding have rank -1.
"""

from __future__ import annotations

import torch


def ranks_of_new_tokens(valid: torch.Tensor, real_before: torch.Tensor) -> torch.Tensor:
    """valid [B,T] bool, real_before [B] -> ranks [B,T] (-1 where not valid)."""
    ranks = real_before[:, None] + valid.long().cumsum(1) - 1
    return torch.where(valid, ranks, torch.full_like(ranks, -1))


def causal_rank_mask(q_rank: torch.Tensor, k_rank: torch.Tensor) -> torch.Tensor:
    """[...,T], [...,S] -> [...,T,S] (leading dims broadcast): key is real and not after the query."""
    qr, kr = q_rank[..., :, None], k_rank[..., None, :]
    return (kr >= 0) & (qr >= 0) & (kr <= qr)


def sink_window_mask(q_rank: torch.Tensor, k_rank: torch.Tensor, sink: int, recent: int) -> torch.Tensor:
    """StreamingLLM: a query of rank r sees keys of rank < sink or in (r - recent, r]. [...,T,S]."""
    qr, kr = q_rank[..., :, None], k_rank[..., None, :]
    return causal_rank_mask(q_rank, k_rank) & ((kr < sink) | (kr > qr - recent))


def sink_window_keep(k_rank: torch.Tensor, real_total: torch.Tensor, sink: int, recent: int) -> torch.Tensor:
    """Which slots a sink_window head keeps once `real_total` [B] real tokens were seen. [B,S] bool."""
    return (k_rank >= 0) & ((k_rank < sink) | (k_rank >= real_total[:, None] - recent))


def protected_slots(k_rank: torch.Tensor, real_total: torch.Tensor, sink: int, recent: int) -> torch.Tensor:
    """H2O never evicts the last `recent` real tokens, nor (for sink_h2o) the first `sink`."""
    return (k_rank >= 0) & ((k_rank < sink) | (k_rank >= real_total[..., None] - recent))


def h2o_priority(scores: torch.Tensor, k_rank: torch.Tensor, real_total: torch.Tensor, sink: int, recent: int) -> torch.Tensor:
    """Eviction priority (higher is kept): +inf protected, accumulated score, -inf empty. [B,G,S]."""
    inf = torch.full_like(scores, float("inf"))
    keep_first = protected_slots(k_rank, real_total[:, None], sink, recent)
    prio = torch.where(keep_first, inf, scores)
    return torch.where(k_rank >= 0, prio, -inf)


def h2o_keep_slots(priority: torch.Tensor, budget: int) -> torch.Tensor | None:
    """H2O eviction: the slots of highest priority, in slot order; None when nothing goes.

    [B,G,S] -> [B,G,S'] with S' = min(budget, most real tokens of any row and head): empty slots
    (priority -inf) are dropped first, so padding is never kept.
    """
    count = min(budget, int((priority > float("-inf")).sum(-1).max().item()))
    if count == priority.shape[-1]:
        return None
    return priority.topk(count, dim=-1).indices.sort(dim=-1).values


def compact_order(keep: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Slot order that moves kept slots first, preserving their order. [...,S] -> indices, count.

    `count` is the largest number of kept slots over rows: the compacted length.
    """
    order = torch.sort((~keep).to(torch.int8), dim=-1, stable=True).indices
    return order, int(keep.sum(-1).max().item()) if keep.numel() else 0


def gather_slots(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Pick slots along the sequence dim. x [B,S] / [B,G,S] / [B,G,S,D]; index [B,S'] or [B,G,S'].

    A [B,S'] index applies to every head of a [B,G,S,D] tensor.
    """
    if index.ndim == 2 and x.ndim == 4:
        index = index[:, None, :].expand(x.shape[0], x.shape[1], index.shape[1])
    dim = index.ndim - 1
    extra = x.shape[index.ndim:]
    idx = index.reshape(*index.shape, *([1] * len(extra))).expand(*index.shape, *extra)
    return torch.gather(x, dim, idx)

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


def in_sink_or_recent(k_rank: torch.Tensor, last_rank: torch.Tensor | int, sink: int, recent: int) -> torch.Tensor:
    """Keys among the first `sink` real tokens or the last `recent` up to rank `last_rank`
    (elementwise, broadcasting): the geometry of sink windows and of H2O's protected tokens."""
    return (k_rank >= 0) & ((k_rank < sink) | (k_rank > last_rank - recent))


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
    extra = x.shape[index.ndim :]
    idx = index.reshape(*index.shape, *([1] * len(extra))).expand(*index.shape, *extra)
    return torch.gather(x, dim, idx)

"""Scores of a sink-window head that sees positions within its cache (StreamingLLM's rule).

A cache holding sinks 0..sink-1 and the window (r - recent, r] of a query of rank r gives them positions
0..sink+recent-1, with no gap between: a window key stays at its distance r - k from the query, and a
sink key k is seen at distance min(r, sink + recent - 1) - k, however far the stream has gone. The model
rotated the query and the window keys at positions of one frame (the rank less the cache's position
base, hf/stream_positions.py), and the sink keys at their ranks: the window scores need nothing; for the
sink scores the query is rotated to position min(r, sink + recent - 1) as well.

Both happen in one attention call: the queries become [q, q at its sink position] and the keys
[window key or 0, 0 or sink key] (twice the channels), so every attention path (masked sdpa,
block-sparse FlexAttention, one-token decode) scores each key with the query it needs.
"""

from __future__ import annotations

import torch

from .rotation import Rotation


def cache_position_view(
    q: torch.Tensor,
    keys: torch.Tensor,
    q_rank: torch.Tensor,
    k_rank: torch.Tensor,
    sink: int,
    capacity: int,
    position_base: torch.Tensor,
    rotation: Rotation,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, H, T, D], keys [B, G, S, D], q_rank [B, T], k_rank [B, S] (-1 empty), position_base [B]
    -> queries [B, H, T, 2D] and keys [B, G, S, 2D] (score with the head's own scaling)."""
    model_position = q_rank - position_base[:, None]
    sink_position = torch.clamp(q_rank, max=capacity - 1)
    q_sink = rotation.rotate(q, torch.where(q_rank >= 0, sink_position - model_position, 0))
    is_sink = ((k_rank >= 0) & (k_rank < sink))[:, None, :, None]
    zero = keys.new_zeros(())
    wide_keys = torch.cat([torch.where(is_sink, zero, keys), torch.where(is_sink, keys, zero)], dim=-1)
    return torch.cat([q, q_sink], dim=-1), wide_keys


def shift_recent_keys(keys: torch.Tensor, k_rank: torch.Tensor, sink: int, delta: torch.Tensor, rotation: Rotation):
    """Keys [B, G, S, D] of a stream whose position base moved up by delta [B]: the window keys (rank >=
    sink) are rotated delta positions back, in place; sink keys stay at their ranks."""
    back = torch.where(k_rank >= sink, -delta[:, None], 0)
    keys.copy_(rotation.rotate(keys, back))

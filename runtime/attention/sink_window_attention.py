"""Sink + recent-window attention (StreamingLLM) for prefill and chunks: O(N·(sink + recent)).

A query of rank r sees the keys of rank < `sink` and in (r - `recent`, r]. Ranks are per row
(-1: padding or an empty slot), so left padding, stored slots in any order and chunked prefill
are all just rank tensors. Long passes run block-sparse FlexAttention (see block_sparse.py): no
N×N tensor, no per-block Python loop, no host sync. Short passes take one masked sdpa call,
where a compiled kernel would cost more than it saves, and so do passes that record gradients on
CPU (compiled FlexAttention has no backward there).
"""

from __future__ import annotations

import torch

from . import block_sparse as BS
from . import dense as DA


def needs_backward_on_cpu(*tensors: torch.Tensor) -> bool:
    """Compiled FlexAttention has no backward on CPU (torch 2.13): a pass that records gradients takes
    the dense masked sdpa instead (exact, differentiable, O(T x S) memory)."""
    return torch.is_grad_enabled() and any(x.requires_grad for x in tensors) and tensors[0].device.type == "cpu"


def sink_window_attention(q, k, v, q_rank, k_rank, policy, scaling: float) -> torch.Tensor:
    """q [B, G*R, T, D], k/v [B, G, S, D], q_rank [B, T], k_rank [B, S] -> [B, G*R, T, D], under
    `policy` (a `SinkWindow`: its `sees` is the rule, its sizes bound the visited blocks).

    Rows of padding queries (rank -1) output zeros or garbage: callers ignore them.
    """
    t, s = q.shape[2], k.shape[2]
    if DA.fits_dense(t * (q.shape[1] // k.shape[1]), s, q.device) or needs_backward_on_cpu(q, k, v):
        return DA.sdpa(
            q, k, v, policy.sees(q_rank[:, None, :, None], k_rank[:, None, None, :]), scaling
        )  # [B, 1, T, S]
    tp, sp = BS.padded_length(t), BS.padded_length(s)
    q_rank, k_rank = BS.pad_to(q_rank, tp, 1, -1), BS.pad_to(k_rank, sp, 1, -1)
    partial, full = BS.visible_blocks(q_rank, k_rank, policy.sink, policy.recent)

    def visible(b, h, q_idx, kv_idx):
        return policy.sees(q_rank[b, q_idx], k_rank[b, kv_idx])

    mask = BS.block_mask(partial[:, None], full[:, None], visible, tp, sp)
    out = BS.flex(BS.pad_to(q, tp, 2), BS.pad_to(k, sp, 2), BS.pad_to(v, sp, 2), mask, scaling)
    return out[:, :, :t]

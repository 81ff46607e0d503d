"""Sink-window (StreamingLLM) attention for training, over key blocks: O(T·(sink+recent)) time and memory.

A query at position i sees the keys at positions < `sink` and in (i - recent, i], causally
(Xiao et al., ICLR 2024, arXiv 2309.17453; the "streaming attention" of DuoAttention's gated
heads, arXiv 2410.10819 §3.1). Upstream DuoAttention trains with a block-sparse flash kernel of
128-token blocks; here queries are cut into blocks of `block` tokens and each block attends to
the sink tokens plus the `ceil((recent-1)/block)+1` key blocks that can hold its recent tokens, through
one batched `scaled_dot_product_attention` call. No [T, T] tensor is ever built.

Shapes: B batch, G KV heads, R query heads per KV head (H = G*R), T tokens, D head dim,
n = ceil(T / block) query blocks, S = sink + (c+1)*block keys per block.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

DEFAULT_BLOCK = 64


def reachable_key_blocks(recent: int, block: int) -> int:
    """c: how many key blocks before a query's own block its recent tokens can reach."""
    return math.ceil((recent - 1) / block)


def block_bias(t: int, sink: int, recent: int, block: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """Additive mask [n, block, S] (0 = attend, -inf = not) for the blocked layout.

    Column j < sink is sink key j; column sink + s is key (b - c)*block + s of query block b.
    Window columns below `sink` are dropped (the sink columns already hold them), so every key
    is counted once. Padded query rows (>= t) get key 0, so no row is empty (an empty row would
    put NaN into the backward pass).
    """
    n, c = math.ceil(t / block), reachable_key_blocks(recent, block)
    i = torch.arange(n * block, device=device).view(n, block, 1)  # query positions
    j = torch.arange(sink, device=device).view(1, 1, sink)
    p = (torch.arange(n, device=device).view(n, 1, 1) - c) * block + torch.arange((c + 1) * block, device=device)
    sink_ok = (j <= i) & (j < t)
    recent_ok = (p >= sink) & (p <= i) & (p > i - recent) & (p < t)
    ok = torch.cat([sink_ok.expand(n, block, sink), recent_ok.expand(n, block, -1)], dim=-1)
    ok[..., 0] |= ~ok.any(-1)
    bias = torch.zeros(ok.shape, dtype=dtype, device=device)
    return bias.masked_fill_(~ok, float("-inf"))


def _key_blocks(k: torch.Tensor, sink: int, c: int, block: int, n: int) -> torch.Tensor:
    """k [B, G, T, D] -> [B, G, n, S, D]: the sink keys, then key blocks b-c .. b of each block b."""
    b, g, t, d = k.shape
    padded = F.pad(k, (0, 0, c * block, n * block - t))  # zeros before the start and after the end
    reachable = padded.unfold(2, (c + 1) * block, block).transpose(-1, -2)  # [B, G, n, (c+1)*block, D]
    sinks = k[:, :, None, :sink].expand(b, g, n, sink, d)  # callers guarantee t > sink
    return torch.cat([sinks, reachable], dim=3)


def blocked_sink_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sink: int,
    recent: int,
    scaling: float,
    block: int = DEFAULT_BLOCK,
) -> torch.Tensor:
    """Blocked streaming attention. q [B, H, T, D], k/v [B, G, T, D] -> [B, H, T, D].

    Differentiable (plain torch ops); equal to `dense_sink_window_attention` up to rounding.
    """
    if sink < 0 or recent < 1 or block < 1:
        raise ValueError(f"need sink >= 0, recent >= 1 and block >= 1, got {sink}, {recent}, {block}")
    b, h, t, d = q.shape
    g = k.shape[1]
    r = h // g
    if t <= sink + recent:  # every sink window covers the whole causal prefix
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=g != h)
    n, c = math.ceil(t / block), reachable_key_blocks(recent, block)
    keys = _key_blocks(k, sink, c, block, n).flatten(0, 1)  # [B*G, n, S, D]
    values = _key_blocks(v, sink, c, block, n).flatten(0, 1)
    qb = F.pad(q, (0, 0, 0, n * block - t)).view(b, g, r, n, block, d)
    qb = qb.permute(0, 1, 3, 2, 4, 5).reshape(b * g, n, r * block, d)  # rows: (query head, position)
    bias = block_bias(t, sink, recent, block, q.dtype, q.device)  # [n, block, S]
    bias = bias[:, None].expand(n, r, block, bias.shape[-1]).reshape(n, r * block, -1)
    out = F.scaled_dot_product_attention(qb, keys, values, attn_mask=bias, scale=scaling)
    out = out.view(b, g, n, r, block, d).permute(0, 1, 3, 2, 4, 5).reshape(b, h, n * block, d)
    return out[:, :, :t]


def dense_sink_window_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sink: int, recent: int, scaling: float
) -> torch.Tensor:
    """Reference with a dense [T, T] mask (tests only). Same shapes as `blocked_sink_window_attention`."""
    t = q.shape[2]
    i = torch.arange(t, device=q.device)[:, None]
    j = torch.arange(t, device=q.device)[None, :]
    mask = (j <= i) & ((j < sink) | (j > i - recent))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling, enable_gqa=k.shape[1] != q.shape[1])

"""Block-sparse FlexAttention over rank tensors: the masks of sink-window and causal attention
as `BlockMask`s built from per-block rank bounds, never from an N×N tensor.

A rank is a token's index among the real tokens of its row (-1: padding, an empty slot, or
rows added to reach a compiled shape). A key of rank kr is visible to a query of rank qr when
both are real, kr <= qr, and kr < sink or kr > qr - recent (`recent=None`: plain causal).
Slots in any order are covered: bounds come from each block's min and max rank.
FlexAttention is only block-sparse when compiled (Triton on CUDA, C++ on CPU); shapes are padded
to a few lengths because dynamic shapes fail to build on CPU in torch 2.13.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, flex_attention

BLOCK = 128  # FlexAttention's tile
RECOMPILE_LIMIT = 64  # padded shapes compiled before dynamo would fall back to eager (scoped to these calls)
_NO_RANK = torch.iinfo(torch.long).max
NO_SINK = _NO_RANK  # `sink` that makes every earlier key visible (causal attention)


@functools.cache
def _compiled_flex_attention():
    return torch.compile(flex_attention, dynamic=False)


def flex(q, k, v, block_mask: BlockMask, scaling: float, score_mod=None, return_lse: bool = False):
    """Compiled FlexAttention with GQA (q [B, G*R, T, D], k/v [B, G, S, D]) -> out, or (out, lse [B, G*R, T])."""
    aux = AuxRequest(lse=True) if return_lse else None
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        result = _compiled_flex_attention()(
            q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scaling, enable_gqa=True, return_aux=aux
        )
    return (result[0], result[1].lse) if return_lse else result


def padded_length(n: int) -> int:
    """n rounded up to a multiple of BLOCK with at most 3 significant bits in its block count
    (< 25% padding past 8 blocks; padded rows and blocks are never visited): 4 compiled shapes per
    doubling of the length."""
    blocks = -(-n // BLOCK)
    step = 1 << max(0, blocks.bit_length() - 3)
    return -(-blocks // step) * step * BLOCK


def pad_to(x: torch.Tensor, length: int, dim: int, value: float = 0) -> torch.Tensor:
    """`x` padded with `value` along `dim` to `length` (no copy when it already has it)."""
    extra = length - x.shape[dim]
    if extra == 0:
        return x
    pad = [0, 0] * (x.ndim - 1 - dim % x.ndim) + [0, extra]
    return F.pad(x, pad, value=value)


def block_rank_bounds(ranks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[..., N] ranks (N a multiple of BLOCK) -> per block: min real rank, max rank, all real. [..., N/BLOCK] each."""
    blocks = ranks.unflatten(-1, (-1, BLOCK))
    real = blocks >= 0
    return torch.where(real, blocks, _NO_RANK).amin(-1), blocks.amax(-1), real.all(-1)


def visible_blocks(q_rank: torch.Tensor, k_rank: torch.Tensor, sink: int, recent: int | None):
    """Which (query block, key block) pairs can hold a visible pair (`partial`) and which hold only
    visible pairs (`full`); disjoint. q_rank [B, Tp], k_rank [B, ..., Sp] -> [B, ..., Tp/BLOCK, Sp/BLOCK]."""
    extra = k_rank.ndim - q_rank.ndim
    q_lo, q_hi, q_all = (x.reshape(x.shape[0], *[1] * extra, x.shape[1], 1) for x in block_rank_bounds(q_rank))
    k_lo, k_hi, k_all = (x.unsqueeze(-2) for x in block_rank_bounds(k_rank))
    some = (k_lo <= q_hi) & (q_hi >= 0)
    every = q_all & k_all & (k_hi <= q_lo)
    if recent is not None:
        some &= (k_lo < sink) | (k_hi > q_lo - recent)
        every &= (k_hi < sink) | (k_lo > q_hi - recent)
    return some & ~every, every


def kv_block_lists(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, H, nq, nk] bool -> (counts [B, H, nq], indices [B, H, nq, nk]) with the chosen blocks first."""
    counts = blocks.sum(-1, dtype=torch.int32)
    order = torch.sort((~blocks).to(torch.int8), dim=-1, stable=True).indices.to(torch.int32)
    return counts, order


def block_mask(partial: torch.Tensor, full: torch.Tensor, mask_mod, q_len: int, kv_len: int) -> BlockMask:
    """BlockMask from [B, H, nq, nk] block maps (H = 1 or the query heads)."""
    return BlockMask.from_kv_blocks(
        *kv_block_lists(partial),
        *kv_block_lists(full),
        BLOCK_SIZE=BLOCK,
        mask_mod=mask_mod,
        seq_lengths=(q_len, kv_len),
    )

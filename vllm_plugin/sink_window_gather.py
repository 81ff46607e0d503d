"""Sink + window attention by gathering each request's visible keys from vLLM's CPU pages: one masked sdpa per
request. The reference for the kernel path (sink_window_backend.py), and the path of a head whose sink is not a
whole number of blocks (virtual_tables.kernel_fits): a query at position p sees key positions < `sink` and in
(p - `recent`, p], as duocal's `SinkWindow.sees`. A Python loop over requests: slow, exact.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .head_plan import DuoVllmError
from .vllm_internals import ops


@functools.cache
def page_layout(isa: str, block_size: int, head_size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the CPU kernel stores token t, channel d of one (block, KV head) page of 2 * block_size *
    head_size elements: (key offsets, value offsets), each [block_size, head_size]."""
    found = []
    for code in (lambda t, d: t + 1, lambda t, d: d + 1):  # small integers: exact in bf16 too
        t, d = torch.meshgrid(torch.arange(block_size), torch.arange(head_size), indexing="ij")
        written = code(t, d).to(dtype)[:, None, :]
        page = torch.zeros(1, 1, 2 * block_size, head_size, dtype=dtype)
        key_cache, value_cache = page.chunk(2, dim=2)
        ops.cpu_attn_reshape_and_cache(
            written, -written, key_cache, value_cache, torch.arange(block_size), isa,
            k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto",
        )  # fmt: skip
        found.append(page.flatten().float())
    token, channel = found
    offsets = []
    for sign in (1, -1):
        index = torch.full((block_size, head_size), -1, dtype=torch.long)
        where = (token * sign > 0).nonzero().flatten()
        index[(token[where] * sign - 1).long(), (channel[where] * sign - 1).long()] = where
        if (index < 0).any() or index.unique().numel() != index.numel():
            raise DuoVllmError(
                f"vLLM's CPU attention pages for isa {isa!r} are not a per-block permutation: duocal_vllm cannot read "
                "streaming heads from them; plan with sparsity 0 (every head full) on this machine"
            )
        offsets.append(index)
    return offsets[0], offsets[1]


def gather_forward(query, kv_cache, attn_metadata, output, *, isa, sink, recent, scale) -> torch.Tensor:
    """query [T, H, D], kv_cache [blocks, Hkv, block_size, 2 * D] -> output [T, H, D], request by request."""
    num_blocks, num_kv_heads, block_size, _ = kv_cache.size()
    pages = kv_cache.view(num_blocks, num_kv_heads, -1).transpose(0, 1)  # [Hkv, blocks, 2 * block_size * D]
    layout = page_layout(isa, block_size, query.shape[-1], kv_cache.dtype)
    starts = attn_metadata.query_start_loc.tolist()
    for r, seq_len in enumerate(attn_metadata.seq_lens.tolist()):
        q0, q1 = starts[r], starts[r + 1]
        if q1 == q0:
            continue
        blocks = attn_metadata.block_table[r]
        out = gather_attend(query[q0:q1], pages, layout, blocks, seq_len, sink, recent, scale)
        output[q0:q1] = out.to(output.dtype)
    return output


def gather_attend(q, pages, layout, blocks, seq_len: int, sink: int, recent: int, scale: float) -> torch.Tensor:
    """q [n, H, D] for the last n positions of a sequence of `seq_len` -> [n, H, D]."""
    n, block_size = q.shape[0], layout[0].shape[0]
    q_pos = torch.arange(seq_len - n, seq_len)
    recent_start = max(0, seq_len - n - recent + 1)
    k_pos = torch.cat([torch.arange(min(sink, recent_start)), torch.arange(recent_start, seq_len)])
    slots = blocks[k_pos // block_size].long()[:, None]
    offsets = k_pos % block_size
    keys = pages[:, slots, layout[0][offsets]]  # [Hkv, S, D]
    values = pages[:, slots, layout[1][offsets]]
    visible = (k_pos[None, :] <= q_pos[:, None]) & (
        (k_pos[None, :] < sink) | (k_pos[None, :] > q_pos[:, None] - recent)
    )
    heads, kv_heads = q.shape[1], keys.shape[0]
    keys = keys.repeat_interleave(heads // kv_heads, dim=0).to(q.dtype)
    values = values.repeat_interleave(heads // kv_heads, dim=0).to(q.dtype)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), keys, values, attn_mask=visible, scale=scale)
    return out.transpose(0, 1)

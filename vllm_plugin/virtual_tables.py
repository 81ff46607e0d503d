"""Per-request *virtual block tables* that let vLLM's CPU paged-attention kernel run a sink + recent head exactly.

The kernel knows a causal sliding window (a query at virtual position p sees virtual keys in (p - window, p]) but
no sinks, and returns no log-sum-exp, so two calls (sinks, recent) cannot be merged. One call is still exact when
each query sees a virtual sequence made of whole blocks. Take sink S (a multiple of the block size B), recent W
(>= B), a query at real position q >= S + W and f, the block holding key q - W + 1 (the first recent key). The
virtual table is [block f, sink blocks 0 .. S/B - 1, blocks f + 1 .. last] and the kernel's sliding window is W + S:
a key of block f is at virtual distance (q - k) + S, visible iff q - k < W; sink keys and later recent keys lie
closer than W + S, so always visible. Queries before S + W see every earlier key: their own table, unchanged.

A chunk of queries (prefill) is cut into *segments* of consecutive queries of one request with the same f (at
most one block's worth each): each segment is one virtual request of the kernel call. A decode step is one
segment per request. This is duocal's `SinkWindow.sees` (runtime/policies/sink_window.py), key for key.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def kernel_fits(sink: int, recent: int, block_size: int) -> bool:
    """Whether virtual tables are exact for this head: whole sink blocks, and recent tokens of at least one block."""
    return sink % block_size == 0 and recent >= block_size


def fitting_block_sizes(sink: int, recent: int, sizes=(128, 96, 64, 32)) -> list[int]:
    """vLLM-CPU block sizes (multiples of 32) with which `kernel_fits`, largest first."""
    return [size for size in sizes if kernel_fits(sink, recent, size)]


@dataclass(frozen=True)
class VirtualBatch:
    """One kernel call's requests: one per segment. Shapes: R' segments, C block-table columns."""

    query_start_loc: torch.Tensor  # [R' + 1] int32
    seq_lens: torch.Tensor  # [R'] int32
    block_table: torch.Tensor  # [R', C], the real table's dtype
    max_query_len: int
    max_seq_len: int

    @property
    def num_reqs(self) -> int:
        return self.seq_lens.numel()


def token_positions(query_start_loc: torch.Tensor, seq_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(request index, position) of every query token. [R + 1], [R] -> [T], [T]; queries end each sequence."""
    query_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()
    request = torch.repeat_interleave(torch.arange(query_lens.numel()), query_lens)
    offset = (seq_lens.long() - query_lens - query_start_loc[:-1].long())[request]
    return request, torch.arange(request.numel()) + offset


def first_recent_block(position: torch.Tensor, sink: int, recent: int, block_size: int) -> torch.Tensor:
    """[T] -> [T]: the block of key `position - recent + 1`, or -1 where the query sees every earlier key."""
    block = torch.div(position - recent + 1, block_size, rounding_mode="floor")
    return torch.where(position >= sink + recent, block, torch.full_like(block, -1))


def virtual_columns(first: torch.Tensor, sink_blocks: int, columns: int) -> torch.Tensor:
    """[R'] first recent blocks -> [R', C]: which real block-table column each virtual column reads."""
    col = torch.arange(columns)[None, :]
    f = first[:, None]
    shifted = torch.where(col == 0, f, torch.where(col <= sink_blocks, col - 1, f + col - sink_blocks))
    return torch.where(f < 0, col, shifted).clamp(0, columns - 1)


def virtual_batch(
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, sink: int, recent: int,
    block_size: int,
) -> VirtualBatch:  # fmt: skip
    """The kernel's requests for R real requests: query_start_loc [R + 1], seq_lens [R], block_table [R, C]."""
    assert kernel_fits(sink, recent, block_size), (sink, recent, block_size)
    request, position = token_positions(query_start_loc, seq_lens)
    first = first_recent_block(position, sink, recent, block_size)
    starts = torch.ones_like(request, dtype=torch.bool)
    starts[1:] = (request[1:] != request[:-1]) | (first[1:] != first[:-1])
    start = starts.nonzero().flatten()
    end = torch.cat([start[1:], start.new_tensor([request.numel()])])
    seg_first, last = first[start], position[end - 1]
    tail = last + 1 - (seg_first + 1) * block_size  # keys after block f, up to the query
    lens = torch.where(seg_first < 0, last + 1, block_size + sink + tail)
    columns = virtual_columns(seg_first, sink // block_size, block_table.shape[1])
    table = block_table[request[start]].gather(1, columns.to(torch.long))
    qsl = torch.cat([start, start.new_tensor([request.numel()])]).to(torch.int32)
    return VirtualBatch(
        qsl, lens.to(torch.int32), table, int((end - start).max()) if start.numel() else 0,
        int(lens.max()) if lens.numel() else 0,
    )  # fmt: skip

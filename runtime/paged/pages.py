"""Where a plan's heads live in the continuous-batching pool: pages of full heads, slots of bounded heads.

Both allocators draw sectors from transformers' one `CachePool` (a sector holds N blocks of
either kind), so the split between full-head and bounded memory follows demand:

- `FullHeadPages` (the engine's `full_attention` allocator): one block is `page_size` tokens of the
  full heads of *every* layer, `[layer][token][K|V][full head][D]`, so a layer with 1 full head
  and one with 8 share a block without padding; a request grows by one block per `page_size`
  tokens. Token `i` of a request lives at row `block * page_size + i % page_size`, the engine's
  own index arithmetic, so its read/write indices and `read_index` gather work unchanged. Quantized
  full heads (`kv_bits` 8 / 4) hold their codes in the same page, after the 16-bit heads
  (quantized_pages.py); their full-precision residual is a ring among the bounded slots.
- `BoundedSlots` (the engine's `sliding_attention` allocator, the only other kind its IO knows):
  a request's whole bounded state, every layer and group: keys, values, ranks and scores as
  duocal's static groups hold them (sink + recent ring, H2O budget), in a few blocks of one size
  (each field in one block). A request takes them when it starts and never grows; an evicted
  token's slot takes the new token in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .batching_internals import CacheAllocator, CachePool
from .quantized_pages import aligned, page_views, quantized_page_fields


class FullHeadPages(CacheAllocator):
    """Pages of the full heads of all layers: `full[l]` = that layer's 16-bit full KV heads (maybe none),
    `quantized[l]` = its quantized full groups [(policy, KV heads)], after them in the page (quantized_pages.py)."""

    supports_block_sharing = False
    supports_block_table = False
    layer_type = "full_attention"
    rows_per_token = 1

    def __init__(self, index: int, full: list[int], quantized: list[list], head_dim: int, dtype, page_size: int):
        self.full, self.head_dim, self.cache_dtype = full, head_dim, dtype
        self.page_elems = [page_size * 2 * f * head_dim for f in full]  # per layer, in elements of `dtype`
        self.layer_offsets = [sum(self.page_elems[:i]) for i in range(len(full))]
        start = aligned(sum(self.page_elems) * dtype.itemsize)
        self.quantized_fields, block_bytes = quantized_page_fields(quantized, head_dim, dtype, page_size, start)
        self._before_cache_tensor_init(index, [0], page_size, aligned(block_bytes), allow_block_sharing=False)

    def register_cache_tensor(self, bytes_per_sector, non_trash_bytes, cache_tensor: torch.Tensor, pool: CachePool):
        self._copy_view = cache_tensor.view(-1, self.bytes_per_block)
        typed = cache_tensor.view(self.cache_dtype)
        blocks, stride = self._copy_view.shape[0], self.bytes_per_block // self.cache_dtype.itemsize
        p, d = self.tokens_per_page, self.head_dim
        self.views = {  # layer -> [block, token, K|V, head, D]
            layer: typed.as_strided((blocks, p, 2, f, d), (stride, 2 * f * d, f * d, d, 1), self.layer_offsets[layer])
            for layer, f in enumerate(self.full)
            if f
        }
        self.quantized_views = page_views(self.quantized_fields, cache_tensor, self.bytes_per_block)
        self._after_cache_tensor_init(non_trash_bytes, bytes_per_sector, typed, pool)  # trash rows: sectors 0, 1

    # --- the engine's block bookkeeping (one block per page_size tokens) ---------------------
    def needs_new_blocks(self, request_id, past_length, query_length):
        have = len(self.block_table.get(request_id, []))
        return max(0, math.ceil((past_length + query_length) / self.tokens_per_page) - have)

    def allocate_cache_to_request(self, request_id, past_length, query_length):
        table = self.block_table.setdefault(request_id, [])
        table.extend(
            self.pool.get_free_blocks(self.index, self.needs_new_blocks(request_id, past_length, query_length))
        )

    def get_seqlen_k(self, past_length, query_length):
        return past_length + query_length

    def _rows(self, request_id, start, end) -> list[int]:
        table, p = self.block_table[request_id], self.tokens_per_page
        return [table[i // p] * p + i % p for i in range(start, end)]

    def get_read_indices(self, request_id, past_length, query_length):
        return self._rows(request_id, 0, past_length + query_length)

    def get_write_indices(self, request_id, past_length, query_length):
        return self._rows(request_id, past_length, past_length + query_length)

    def fill_block_table(self, *args):
        raise NotImplementedError("duocal's paged cache has no block-table decode path")

    def get_cache_for_block_table(self, layer_idx):
        raise NotImplementedError("duocal's paged cache has no block-table decode path")

    # --- storage ------------------------------------------------------------------------------
    def update(self, key_states, value_states, layer_idx, read_index, write_index):
        """k/v [T, F, D] of the layer's full heads -> every request's history in batch order [N, F, D]."""
        view = self.views[layer_idx]
        p = self.tokens_per_page
        view[write_index // p, write_index % p, 0] = key_states
        view[write_index // p, write_index % p, 1] = value_states
        if read_index.numel() == 0:
            return key_states, value_states
        rows = view[read_index // p, read_index % p]  # [N, 2, F, D]
        return rows[:, 0], rows[:, 1]


@dataclass(frozen=True)
class SlotField:
    """One tensor of one bounded group's state inside one of a request's blocks (batch dim left out)."""

    layer: int
    group: int | str  # a bounded group's index, or a quantized full group's ring (quantized_pages.ring_key)
    name: str  # the static group's attribute: k, v, rank, score, ...
    shape: tuple[int, ...]
    dtype: torch.dtype
    chunk: int  # which of the request's blocks holds it
    offset: int  # bytes from the start of that block


def pack(sizes: list[int], block: int) -> list[tuple[int, int]]:
    """First-fit by decreasing size: (block index, offset) for each size (in the order given)."""
    used: list[int] = []
    placed: dict[int, tuple[int, int]] = {}
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        chunk = next((c for c, taken in enumerate(used) if taken + sizes[i] <= block), len(used))
        if chunk == len(used):
            used.append(0)
        placed[i] = (chunk, used[chunk])
        used[chunk] += sizes[i]
    return [placed[i] for i in range(len(sizes))]


def slot_fields(states: dict[tuple[int, int], dict[str, torch.Tensor]], unit: int) -> tuple[list[SlotField], int, int]:
    """The layout of a request's bounded state ((layer, group) -> {name: tensor [1, ...]}) in blocks of
    one size, a multiple of `unit` (the full-head page): (fields, block bytes, blocks per request).
    Small blocks keep the pool's sectors small (a sector is the least common multiple of block sizes);
    of the multiples up to 8x the smallest that holds the largest field, the one that wastes least
    once the fields are packed (first-fit by decreasing size) is taken."""
    items = [((layer, group), name, t) for (layer, group), tensors in states.items() for name, t in tensors.items()]
    if not items:
        return [], 0, 0
    sizes = [aligned(t[0].numel() * t.element_size()) for _, _, t in items]
    smallest = -(-max(sizes) // unit)
    block = min(
        (unit * m for m in range(smallest, 8 * smallest + 1)), key=lambda b: (1 + max(c for c, _ in pack(sizes, b))) * b
    )
    where = pack(sizes, block)
    fields = [
        SlotField(layer, group, name, tuple(t.shape[1:]), t.dtype, *spot)
        for ((layer, group), name, t), spot in zip(items, where, strict=True)
    ]
    return fields, block, 1 + max(c for c, _ in where)


class BoundedSlots(CacheAllocator):
    """`chunks` blocks per request holding its whole bounded state (`slot_fields`), taken when it starts."""

    supports_block_sharing = False
    supports_block_table = False
    layer_type = "sliding_attention"
    rows_per_token = 1

    def __init__(self, index: int, fields: list[SlotField], block_bytes: int, chunks: int):
        self.fields, self.chunks = fields, chunks
        self._before_cache_tensor_init(index, [0], 1, block_bytes, allow_block_sharing=False)

    def register_cache_tensor(self, bytes_per_sector, non_trash_bytes, cache_tensor: torch.Tensor, pool: CachePool):
        self._copy_view = cache_tensor.view(-1, self.bytes_per_block)
        blocks = self._copy_view.shape[0]
        self.views: dict[tuple[int, int], dict[str, tuple[torch.Tensor, int]]] = {}
        for f in self.fields:
            typed, size = cache_tensor.view(f.dtype), f.dtype.itemsize
            strides = torch.empty(f.shape, device="meta").stride()
            view = typed.as_strided((blocks, *f.shape), (self.bytes_per_block // size, *strides), f.offset // size)
            self.views.setdefault((f.layer, f.group), {})[f.name] = (view, f.chunk)
        self._after_cache_tensor_init(non_trash_bytes, bytes_per_sector, cache_tensor, pool)

    def needs_new_blocks(self, request_id, past_length, query_length):
        return 0 if self.block_table.get(request_id) else self.chunks

    def allocate_cache_to_request(self, request_id, past_length, query_length):
        if self.block_table.get(request_id):
            return
        self.block_table[request_id] = self.pool.get_free_blocks(self.index, self.chunks)
        self.clear(self.block_table[request_id])

    def clear(self, blocks: list[int]) -> None:
        """A fresh request's state: every slot empty (rank -1), zeros elsewhere."""
        for tensors in self.views.values():
            for name, (view, chunk) in tensors.items():
                view[blocks[chunk]].fill_(-1 if name == "rank" else 0)

    def blocks_of(self, request_id: str) -> list[int]:
        return self.block_table[request_id]

    def get_seqlen_k(self, past_length, query_length):
        return query_length  # bounded heads read their slots, not the engine's index

    def get_read_indices(self, request_id, past_length, query_length):
        return []

    def get_write_indices(self, request_id, past_length, query_length):
        return []

    def fill_block_table(self, *args):
        raise NotImplementedError("duocal's paged cache has no block-table decode path")

    def get_cache_for_block_table(self, layer_idx):
        raise NotImplementedError("duocal's paged cache has no block-table decode path")

    def update(self, *args):
        raise NotImplementedError("bounded slots are read and written by duocal's attention, not by update()")

"""Where each KV head's cache layer goes in vLLM's KV cache groups, so that a layer's heads of one policy are
neighbours in one group and attend in one kernel call.

Every KV head keeps a cache layer of its own (one head per page: vLLM wants one page size across its groups). vLLM
(kv_cache_utils `_get_kv_cache_groups_uniform_page_size`) puts the cache layers of one spec in a bucket in the order
they were built, takes as group size the smallest bucket's count (the largest's when it is under 1.5x the
smallest), and splits a bucket of M layers into N = ceil(M / size) groups, group i holding layers i, i + N, ...
A group's layers lie one region of `num_blocks` pages after another (layout LBHNC), so heads that are consecutive
layers of one group are one strided view ``[num_blocks, f, block, 2 * head]``: one kernel call over all of them.

`cache_layout` packs each layer's heads of one policy (a *segment*) into a bucket's N groups (columns of `size`
rows; an exact search finds a packing without splits whenever one exists), fills the rows vLLM would leave as padding
with spare cache layers (that memory is allocated either way) and returns the build order that makes vLLM's i::N
split give exactly those columns. When no packing keeps every segment whole (segments of 4, 3, 3 and 2 heads in
three groups of 4), some are split, one call per piece; `calls_per_layer` counts them.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

SPARE = None  # a cache layer that holds a padding row (never attended)


@dataclass(frozen=True)
class CacheSlot:
    """One cache layer to build: `head` (a rank-local KV head of `layer`) with policy `key`, or a spare."""

    layer: int
    key: Hashable
    head: int | None


@dataclass(frozen=True)
class Call:
    """One kernel call of a layer: its KV heads of one policy, in the order of their cache layers."""

    key: Hashable
    heads: tuple[int, ...]


@dataclass(frozen=True)
class CacheLayout:
    build_order: list[CacheSlot]  # the order the cache layers are built in
    calls: list[list[Call]]  # per layer

    @property
    def calls_per_layer(self) -> list[int]:
        return [len(calls) for calls in self.calls]


def group_size(bucket_counts: list[int]) -> int:
    """vLLM's layers per KV cache group for buckets of these sizes."""
    smallest, largest = min(bucket_counts), max(bucket_counts)
    return largest if largest < 1.5 * smallest else smallest


def cache_layout(rows: list[list[Hashable]]) -> CacheLayout:
    """`rows[layer][head]`: each rank-local KV head's policy key (equal keys share a KV cache spec)."""
    segments: dict[Hashable, list[tuple[int, tuple[int, ...]]]] = {}
    for layer, row in enumerate(rows):
        for key in dict.fromkeys(row):
            segments.setdefault(key, []).append((layer, tuple(h for h, k in enumerate(row) if k == key)))
    size = group_size([sum(len(heads) for _, heads in segs) for segs in segments.values()])
    calls: list[list[Call]] = [[] for _ in rows]
    order: list[CacheSlot] = []
    for key, segs in segments.items():
        columns = pack(segs, math.ceil(sum(len(heads) for _, heads in segs) / size), size)
        for layer, heads in (piece for column in columns for piece in column):
            calls[layer].append(Call(key, heads))
        order += interleave(columns, key, size)
    return CacheLayout(order, calls)


def pack(segments: list[tuple[int, tuple[int, ...]]], columns: int, size: int) -> list[list[tuple[int, tuple]]]:
    """Segments (layer, heads) into `columns` columns of `size` rows, none split when any packing exists (a search,
    largest segments first); else as many whole as first fit places, the rest split over the emptiest columns.
    One column: the segments in layer order."""
    if columns == 1:
        return [list(segments)]
    ordered = sorted(segments, key=lambda seg: -len(seg[1]))
    placed = whole_packing([len(heads) for _, heads in ordered], columns, size)
    packed: list[list[tuple[int, tuple]]] = [[] for _ in range(columns)]
    if placed is not None:
        for (layer, heads), column in zip(ordered, placed, strict=True):
            packed[column].append((layer, heads))
        return packed
    free = [size] * columns
    for layer, heads in ordered:
        fitting = [c for c in range(columns) if free[c] >= len(heads)]
        while heads:
            column = min(fitting, key=lambda c: free[c]) if fitting else max(range(columns), key=lambda c: free[c])
            piece, heads = heads[: free[column]], heads[free[column] :]
            packed[column].append((layer, piece))
            free[column] -= len(piece)
            fitting = []
    return packed


def whole_packing(sizes: list[int], columns: int, size: int) -> list[int] | None:
    """A column per item (items largest first) so that no column holds more than `size`, or None if none exists.
    Depth-first over the columns' free rows, memoizing the (item, free rows as a multiset) states that failed:
    exact, and fast for the few columns and small items of a plan (a layer's heads of one policy)."""
    failed: set[tuple[int, tuple[int, ...]]] = set()
    free, placed = [size] * columns, [0] * len(sizes)

    def place(i: int) -> bool:
        if i == len(sizes):
            return True
        state = (i, tuple(sorted(free)))
        if state in failed:
            return False
        tried = set()
        for column in range(columns):
            if free[column] < sizes[i] or free[column] in tried:
                continue
            tried.add(free[column])
            free[column] -= sizes[i]
            placed[i] = column
            if place(i + 1):
                return True
            free[column] += sizes[i]
        failed.add(state)
        return False

    return placed if place(0) else None


def interleave(columns: list[list[tuple[int, tuple]]], key: Hashable, size: int) -> list[CacheSlot]:
    """The build order whose i::N split gives `columns` (each padded to `size` rows with spares when N > 1)."""
    stacks = [[CacheSlot(layer, key, h) for layer, heads in column for h in heads] for column in columns]
    if len(stacks) == 1:
        return stacks[0]
    spare_layer = columns[0][0][0]  # a spare is named in some layer: vLLM reads an index off every name
    for stack in stacks:
        stack += [CacheSlot(spare_layer, key, SPARE)] * (size - len(stack))
    return [stack[row] for row in range(size) for stack in stacks]

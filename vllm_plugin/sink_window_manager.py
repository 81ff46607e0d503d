"""vLLM's block manager of a streaming head's KV cache group: frees the blocks between the sink blocks and the
window, and serves prefix-cache hits that carry the request's own sinks.

A recomputation that starts at token h (a prefix-cache hit of h tokens) reads the first `sink` tokens and the last
`recent` - 1 tokens before h, nothing between (duocal's `SinkWindow.sees`). vLLM's sliding-window manager checks the
second part only; this one checks both, for every group of the spec (vLLM's hybrid lookup passes them together):

- lookup: a hit of n blocks is reported exactly when every block `hit_reads(n)` names is cached (`longest_hit`);
- hashing: the sink blocks always get a hash, whatever `prefix_cache_retention_interval` keeps of the window tails
  (`reachable_block_mask`), else no hit could ever find them;
- the hit's blocks reach the request with its sinks, not vLLM's null block (`add_local_computed_blocks`): the
  kernel reads the block table's first columns as the sinks (virtual_tables.py);
- allocation counts the cached sink blocks a hit takes out of the free queue, and admission reserves what the
  request will hold at its peak (`get_num_blocks_to_allocate`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from .vllm_internals import SlidingWindowManager, cdiv, resolve_block_hashes


def hit_reads(blocks: int, sink_blocks: int, recent_blocks: int) -> list[int]:
    """The block indices a recomputation starting after `blocks` cached blocks reads: the sink blocks, and the
    `recent_blocks` blocks before the hit (cdiv(recent - 1, block_size)); every block while they overlap."""
    recent_start = max(0, blocks - recent_blocks)
    return sorted({*range(min(sink_blocks, blocks)), *range(recent_start, blocks)})


def longest_hit(cached: Callable[[int], bool], max_blocks: int, sink_blocks: int, recent_blocks: int, step: int) -> int:
    """The most blocks n <= `max_blocks`, a multiple of `step`, such that `cached(i)` holds for every i in
    `hit_reads(n)`; 0 if none. Asks `cached` of each block at most once, from the sinks, then right to left."""
    leading = 0
    while leading < min(sink_blocks, max_blocks) and cached(leading):
        leading += 1
    if leading < sink_blocks:  # an uncached sink block (or a prompt inside the sinks): hits end before it
        return leading - leading % step
    n = max_blocks - max_blocks % step
    while n > 0:
        recent = range(n - 1, max(sink_blocks, n - recent_blocks) - 1, -1)
        missing = next((i for i in recent if not cached(i)), None)
        if missing is None:
            return n
        n = missing - missing % step  # every hit in (missing, n) reads the missing block too
    return 0


class SinkWindowManager(SlidingWindowManager):
    """A `SlidingWindowManager` that keeps the first `sink_blocks` blocks of every request and serves prefix-cache
    hits that read them (the module's docstring)."""

    def __init__(self, kv_cache_spec, **kwargs) -> None:
        super().__init__(kv_cache_spec, **kwargs)
        self.sink_blocks = kv_cache_spec.sink_blocks

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        del num_prompt_tokens
        skipped = self.get_num_skipped_tokens(processed_computed_tokens)
        if skipped <= 0 or request_id not in self.req_to_blocks:
            return
        last = min(skipped // self.block_size, len(self.req_to_blocks[request_id]))
        self._remove_blocks_in_range(request_id, self.sink_blocks, last)

    @classmethod
    def find_longest_cache_hit(
        cls, block_hashes, max_length: int, kv_cache_group_ids: list[int], block_pool, kv_cache_spec,
        drop_eagle_block: bool, alignment_tokens: int, dcp_world_size: int = 1, pcp_world_size: int = 1,
    ):  # fmt: skip
        """Per group, the hit's blocks (the sinks and the window before the hit, vLLM's null block between) and the
        hit's length in tokens. EAGLE's dropped last block is not supported: no hit (prefill from the start)."""
        groups = len(kv_cache_group_ids)
        if drop_eagle_block or dcp_world_size > 1 or pcp_world_size > 1:
            return tuple([] for _ in range(groups)), 0
        size = kv_cache_spec.block_size
        hashes = resolve_block_hashes(block_hashes, block_pool.hash_block_size, size, alignment_tokens=alignment_tokens)
        found: dict[int, list | None] = {}

        def cached(i: int) -> bool:
            if i not in found:
                found[i] = block_pool.get_cached_block(hashes[i], kv_cache_group_ids)
            return found[i] is not None

        recent_blocks = cdiv(kv_cache_spec.sliding_window - 1, size)
        step = math.lcm(size, alignment_tokens) // size
        n = longest_hit(cached, max_length // size, kv_cache_spec.sink_blocks, recent_blocks, step)
        hit = tuple([block_pool.null_block] * n for _ in range(groups))
        for i in hit_reads(n, kv_cache_spec.sink_blocks, recent_blocks):
            for blocks, block in zip(hit, found[i], strict=True):
                blocks[i] = block
        return hit, n * size

    @classmethod
    def reachable_block_mask(cls, start_block: int, end_block: int, alignment_tokens, kv_cache_spec, use_eagle: bool,
                             retention_interval=None, reachable_boundaries=(), dcp_world_size: int = 1,
                             final_segment_end_block=None) -> list[bool] | None:  # fmt: skip
        """vLLM's sliding-window mask (the window tails its retention interval keeps), with every sink block kept."""
        mask = super().reachable_block_mask(
            start_block, end_block, alignment_tokens, kv_cache_spec, use_eagle, retention_interval,
            reachable_boundaries, dcp_world_size, final_segment_end_block,
        )  # fmt: skip
        if mask is not None:
            for i in range(start_block, min(end_block, kv_cache_spec.sink_blocks)):
                mask[i - start_block] = True
        return mask

    def add_local_computed_blocks(
        self, request_id: str, new_computed_blocks: Sequence, num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:  # fmt: skip
        """vLLM's (the blocks the window skipped become the null block), then the hit's sink blocks in front."""
        skipped = self.get_num_skipped_tokens(num_local_computed_tokens + num_external_computed_tokens)
        sinks = list(new_computed_blocks[: min(self.sink_blocks, skipped // self.block_size)])
        super().add_local_computed_blocks(
            request_id, new_computed_blocks, num_local_computed_tokens, num_external_computed_tokens
        )
        if sinks and self.enable_caching:
            self.block_pool.touch(sinks)
        self.req_to_blocks[request_id][: len(sinks)] = sinks

    def get_num_blocks_to_allocate(
        self, request_id: str, num_tokens: int, new_computed_blocks: Sequence, total_computed_tokens: int,
        num_local_computed_tokens: int, num_tokens_main_model: int, apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:  # fmt: skip
        """vLLM's count plus the hit's cached sink blocks that sit in the free queue (touching takes them out of
        it). Under the admission cap, a hit request is reserved what it will hold at its peak (its sinks, the
        window and its chunk in flight), less the sink blocks other requests hold: vLLM's own count subtracts
        every position the hit covers, nulls included, and reserves next to nothing."""
        counted = super().get_num_blocks_to_allocate(
            request_id, num_tokens, new_computed_blocks, total_computed_tokens, num_local_computed_tokens,
            num_tokens_main_model, apply_admission_cap, prefill_end,
        )  # fmt: skip
        if request_id in self.num_cached_block or not new_computed_blocks:
            return counted  # a running request, or no hit: vLLM's count is right
        skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        sinks = new_computed_blocks[: min(self.sink_blocks, skipped)]
        free_sinks = self._get_num_evictable_blocks(sinks)
        if not apply_admission_cap or self.max_admission_blocks_per_request is None:
            return counted + free_sinks
        held = cdiv(num_tokens, self.block_size) - max(0, skipped - self.sink_blocks)
        shared_sinks = sum(not block.is_null for block in sinks) - free_sinks
        return max(0, min(held, self.max_admission_blocks_per_request) - shared_sinks)

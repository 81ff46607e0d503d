"""`DuoPagedCache`: transformers' `PagedAttentionCache` with storage that follows a duocal plan.

The engine (scheduler, IO packing, sampling, requests) is transformers' own; this cache replaces
its storage: full heads in growing pages, bounded heads in one fixed block per request (see
pages.py), one pool of sectors for both. The scheduler admits a request by what it really needs
(`can_store_request_tokens`). `update` stores a layer's full-head tokens and hands the layer and
the step's batch (`PagedStep`) to duocal's attention function, which attends every group.

Version-specific (transformers 5.24): the attribute surface the engine reads (`cache_allocators`
with keys `full_attention` / `sliding_attention`, `max_tokens_read`, `pool`, ...), the per-request
`extend_read_and_write_indices` calls in packing order, `update(k, v, layer_idx, kwargs)`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from math import ceil, lcm

import torch

from ..compat import LAYER_KWARG, check_attention_is
from ..planning.plan import Plan
from ..planning.sizes import bytes_with_count
from .batching_internals import CachePool, PagedAttentionCache, PagedAttentionMemoryHandler
from .paged_attention import PagedLayerPass, PagedStep
from .pages import BoundedSlots, FullHeadPages, slot_fields
from .pool_size import plain_block_bytes, plain_request_bytes
from .quantized_pages import ALIGN, ring_key, ring_state

logger = logging.getLogger("duocal_runtime.paged")


@dataclass(frozen=True)
class LayerHeads:
    """One layer of the plan: its 16-bit full KV heads, its quantized full groups and its bounded groups
    (groups: (policy, KV heads))."""

    full: list[int]
    quantized: list[tuple]
    bounded: list[tuple]

    @classmethod
    def of(cls, plan: Plan, layer: int) -> LayerHeads:
        groups = plan.layer_groups(layer)
        unbounded = [(policy, heads) for policy, heads in groups if not policy.bounded]
        return cls(
            [h for policy, heads in unbounded if not policy.quantized for h in heads],
            [(policy, heads) for policy, heads in unbounded if policy.quantized],
            [(policy, heads) for policy, heads in groups if policy.bounded],
        )


class DuoPagedCache(PagedAttentionCache):
    """Paged storage for `plan` in one pool of `num_sectors` sectors (see pages.py)."""

    made_by_duocal = True

    def __init__(self, plan: Plan, config, cb_config, device, dtype: torch.dtype, rep: int, owner=None):
        # The engine's constructor sizes every layer by one head count: this one is built from the plan.
        self._lay_out(plan, dtype, rep, cb_config.page_size)
        self.config, self.device = config, device
        self.owner = owner  # the Runtime whose attention function reads this cache
        self.max_blocks_per_request = 0
        self.max_batch_tokens, self.num_sectors = self._size(config, cb_config)
        non_trash = self.num_sectors * self.bytes_per_sector
        self.cache_tensor = torch.zeros(non_trash + 2 * self.bytes_per_sector, dtype=torch.uint8, device=device)
        self.pool = CachePool(self.num_sectors, len(self.cache_allocators))
        for allocator in self.cache_allocators.values():
            allocator.register_cache_tensor(self.bytes_per_sector, non_trash, self.cache_tensor, self.pool)
        self.allow_block_sharing = self.use_prefix_sharing = False
        self.num_blocks = non_trash // plain_block_bytes(self.plan.shape, self.dtype, cb_config.page_size)
        self.read_cache_limit, self.max_decode_fast_path_length = None, 0
        self.max_tokens_read = self._readable_tokens(config)
        self.chunk_sensitive = plan.chunking_changes_result
        self._pending: list[tuple[str, int, int]] = []
        self._step: PagedStep | None = None

    # --- layout and size ------------------------------------------------------------------------
    def _lay_out(self, plan: Plan, dtype: torch.dtype, rep: int, page_size: int) -> None:
        """Where each head lives and the sector size: everything but the pool itself."""
        self.plan, self.dtype, self.rep = plan, dtype, rep
        self.layers = [LayerHeads.of(plan, layer) for layer in range(plan.shape.num_hidden_layers)]
        self.cache_allocators = self._allocators(page_size)
        self.bytes_per_sector = lcm(*(ca.bytes_per_block for ca in self.cache_allocators.values()), 128)
        self.tokens_per_sector = max(
            (self.bytes_per_sector // ca.bytes_per_block) * ca.tokens_per_page for ca in self.cache_allocators.values()
        )

    @classmethod
    def smallest_pool_blocks(cls, plan: Plan, dtype: torch.dtype, page_size: int, tokens: int) -> int:
        """The fewest of transformers' `num_blocks` (plain blocks of `page_size` tokens) whose pool holds one
        request of `tokens` tokens under `plan`: from the layout alone, before any pool or weights exist."""
        layout = cls.__new__(cls)  # nothing but the layout: no pool, no engine
        layout._lay_out(plan, dtype, plan.shape.num_attention_heads // plan.shape.num_key_value_heads, page_size)
        wanted = layout.sectors_for(tokens) * layout.bytes_per_sector
        return -(-wanted // plain_block_bytes(plan.shape, dtype, page_size))

    def _allocators(self, page_size: int) -> dict:
        head_dim, allocators = self.plan.shape.head_dim, {}
        full, quantized = [len(layer.full) for layer in self.layers], [layer.quantized for layer in self.layers]
        if any(full) or any(quantized):
            allocators["full_attention"] = FullHeadPages(0, full, quantized, head_dim, self.dtype, page_size)
        unit = allocators["full_attention"].bytes_per_block if allocators else ALIGN
        fields, block, chunks = slot_fields(self.bounded_states(), unit)
        if fields:
            allocators["sliding_attention"] = BoundedSlots(len(allocators), fields, block, chunks)
        return allocators

    def bounded_states(self) -> dict[tuple[int, int], dict[str, torch.Tensor]]:
        """(layer, group) -> the state one request's static group holds ({name: [1, ...] tensor})."""
        states = {}
        for layer, heads in enumerate(self.layers):
            for g, (policy, kv_heads) in enumerate(heads.bounded):
                group = policy.make_group(kv_heads, self.rep, max_length=1)
                group.fill(1, 1, self.plan.shape.head_dim, self.dtype, "cpu")
                states[(layer, g)] = group.state()
            for g, (policy, kv_heads) in enumerate(heads.quantized):
                states[(layer, ring_key(g))] = ring_state(policy, len(kv_heads), self.plan.shape.head_dim, self.dtype)
        return states

    def _size(self, config, cb_config) -> tuple[int, int]:
        """(max_batch_tokens, sectors): `num_blocks` converted to this plan's sectors, else transformers'
        sizing from free memory with this pool's sector size."""
        if cb_config.num_blocks is None:
            return PagedAttentionMemoryHandler(
                config=config,
                cb_config=cb_config,
                dtype=self.dtype,
                bytes_per_sector=self.bytes_per_sector,
                tokens_per_sector=self.tokens_per_sector,
                bytes_per_block=plain_block_bytes(self.plan.shape, self.dtype, cb_config.page_size),
                attn_types=list(self.cache_allocators),
            ).infer_max_batch_tokens_and_num_sectors()
        wanted = cb_config.num_blocks * plain_block_bytes(self.plan.shape, self.dtype, cb_config.page_size)
        sectors = wanted // self.bytes_per_sector
        if sectors < 1:
            raise ValueError(
                f"a KV pool of {bytes_with_count(wanted)} holds no sector of this plan "
                f"({bytes_with_count(self.bytes_per_sector)}: one "
                "request's bounded heads, or a run of full-head pages); give more KV memory"
            )
        return cb_config.max_batch_tokens or PagedAttentionMemoryHandler._default_max_batch_tokens, sectors

    def _readable_tokens(self, config) -> int:
        """Tokens one pass may read through the engine's index: the full-head pages. Bounded heads read
        their own slots, so a plan without full heads may read as many tokens as requests fit x positions."""
        pages = self.cache_allocators.get("full_attention")
        if pages is not None:
            return pages.tokens_per_page * pages.num_blocks
        return self.num_sectors * getattr(config, "max_position_embeddings", 1 << 16)

    # --- accounting -----------------------------------------------------------------------------
    def request_bytes(self, request_id: str) -> int:
        """KV bytes a request holds now: its full-head pages and its block of bounded slots."""
        return sum(
            len(ca.block_table.get(request_id, ())) * ca.bytes_per_block for ca in self.cache_allocators.values()
        )

    def blocks_for(self, tokens: int) -> dict[str, int]:
        """Blocks of each allocator a request of `tokens` tokens needs (page rounding included)."""
        return {name: ca.needs_new_blocks("", 0, tokens) for name, ca in self.cache_allocators.items()}

    def bytes_for(self, tokens: int) -> int:
        """KV bytes a request of `tokens` tokens needs in this pool."""
        return sum(n * self.cache_allocators[name].bytes_per_block for name, n in self.blocks_for(tokens).items())

    def sectors_for(self, tokens: int) -> int:
        """Sectors a request of `tokens` tokens needs when it is alone in the pool."""
        blocks = self.blocks_for(tokens)
        per_sector = {name: self.bytes_per_sector // ca.bytes_per_block for name, ca in self.cache_allocators.items()}
        return sum(ceil(n / per_sector[name]) for name, n in blocks.items())

    def pool_size(self) -> int:
        """The pool's bytes (its sectors')."""
        return self.num_sectors * self.bytes_per_sector

    def free_sectors(self) -> int:
        self.pool.try_to_free_sectors()
        return self.pool.num_free_sectors

    def idle_sectors(self) -> int:
        """Sectors no request holds a block of: unassigned ones and those whose blocks all came back (the pool
        releases those lazily, in `free_sectors`). Reads without changing the pool (the batching thread owns
        it), so a count taken mid-step may be one step old."""
        whole = sum(
            sum(len(leaves) == trees.elems_per_tree for leaves in list(trees.trees.values()))
            for trees in self.pool._free_blocks
        )
        return self.pool.num_free_sectors + whole

    def page_counts(self) -> dict[str, tuple[int, int]]:
        """allocator name -> (blocks requests hold, blocks it could still take: its free blocks in sectors in
        use, and every idle sector's worth; an idle sector counts for each allocator). Read-only, as above."""
        idle, counts = self.idle_sectors(), {}
        for name, ca in self.cache_allocators.items():
            trees = self.pool._free_blocks[ca.index]
            held = sum(len(blocks) for blocks in list(ca.block_table.values()))
            partial = sum(len(leaves) for leaves in list(trees.trees.values()) if len(leaves) < trees.elems_per_tree)
            counts[name] = (held, partial + idle * ca.blocks_per_sector)
        return counts

    # --- what the engine calls ------------------------------------------------------------------
    def can_store_request_tokens(self, state, request_len: int, dry_run: bool = False) -> bool:
        # Plans whose result depends on where a prompt is cut (H2O evicts after every chunk) prefill
        # each prompt in one pass, as duocal's generate() does: a prompt is never split by the load.
        if self.chunk_sensitive and request_len < len(state.remaining_prefill_tokens or state.tokens_to_process):
            return False
        return super().can_store_request_tokens(state, request_len, dry_run)

    def search_prefix_match(self, request_id, prompt_ids) -> int:
        return 0

    def count_new_complete_blocks(self, state, request_len) -> dict:
        return {}

    def mark_complete_blocks(self, *args) -> None:
        return None

    def evict_cached_blocks(self) -> bool:
        return False

    def extend_read_and_write_indices(self, request_id, past_length, query_length, read_index, write_index):
        self._pending.append((request_id, past_length, query_length))
        super().extend_read_and_write_indices(request_id, past_length, query_length, read_index, write_index)

    def abandon_pass(self) -> None:
        """A forward pass failed before (or while) reading its requests: the next pass starts clean."""
        self._pending = []

    def _begin_step(self, device, kwargs: dict) -> PagedStep:
        pending, self._pending = self._pending, []
        ids = [rid for rid, _, _ in pending]
        slots = self.cache_allocators.get("sliding_attention")
        blocks = None if slots is None else torch.tensor([slots.blocks_of(r) for r in ids], device=device)
        step = PagedStep(ids, [p for _, p, _ in pending], [q for _, _, q in pending], blocks)
        pages = self.cache_allocators.get("full_attention")
        if pages is not None:  # every token's page row, each request's history then its new tokens
            read = kwargs["read_index"][pages.index]
            step.page_rows = read if read.numel() else kwargs["write_index"][pages.index]  # fresh prefills only
            lengths = torch.tensor([p + n for p, n in zip(step.past, step.new, strict=True)], device=device)
            step.row_starts = torch.cumsum(lengths, 0) - lengths
        return step

    @torch.compiler.disable
    def update(self, key_states, value_states, layer_idx: int, kwargs: dict):
        """Store the layer's full-head tokens; hand the layer to duocal's attention. k/v [1, Hkv, T, D]."""
        if layer_idx == 0:
            check_attention_is(self.owner, "paged cache")
            self._step = self._begin_step(key_states.device, kwargs)
        heads, full_k, full_v, read = self.layers[layer_idx], None, None, False
        pages = self.cache_allocators.get("full_attention")
        if heads.full:
            index = torch.tensor(heads.full, device=key_states.device)
            k, v = (x[0].index_select(0, index).transpose(0, 1) for x in (key_states, value_states))  # [T, F, D]
            read_index = kwargs["read_index"][pages.index]
            full_k, full_v = pages.update(k, v, layer_idx, read_index, kwargs["write_index"][pages.index])
            read = read_index.numel() > 0
        kwargs[LAYER_KWARG] = PagedLayerPass(self, layer_idx, self._step, full_k, full_v, read)
        return key_states, value_states


def pool_summary(cache: DuoPagedCache, context: int, page_size: int) -> dict:
    """The pool's bytes and how many requests of `context` tokens it holds at once, against the
    requests of plain attention in the same bytes (transformers' own cache, same page size)."""
    need = cache.blocks_for(context)
    ceiling = cache.num_sectors + 1
    held = cache.count_storable_requests([need] * ceiling)
    plain_per_request = plain_request_bytes(cache.plan.shape, cache.dtype, context, page_size)
    return {
        "kv_bytes": cache.pool_size(),
        "context": context,
        "requests": held,
        "plain_requests": cache.pool_size() // plain_per_request,
        "bytes_per_request": cache.bytes_for(context),
        "plain_bytes_per_request": plain_per_request,
    }

"""`sink_window`: a streaming head keeps the first `sink` tokens and the last `recent`.

StreamingLLM (Xiao et al., ICLR 2024, arXiv 2309.17453); DuoAttention's streaming heads.
A query of rank r attends to ranks < sink and in (r - recent, r], in prefill too: block-sparse
FlexAttention, O(N·(sink + recent)). Every head of a group keeps the same ranks; `rank` [B, S]
holds each slot's real-token rank (-1 empty). Slots are unordered: keys carry their position
through RoPE, so a decode step overwrites the oldest window slot in place.

`positions`: "original" (DuoAttention's rule, the default) scores each key at its distance in the
sequence; "cache" (StreamingLLM's rule) at its distance within the cache, so that no distance exceeds
sink + recent and a stream can run past the model's trained length (attention/cache_positions.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..attention import ranks as R
from ..attention.cache_positions import cache_position_view, shift_recent_keys
from ..attention.dense import decode_sdpa
from ..attention.sink_window_attention import sink_window_attention
from ..errors import PlanError
from .base import DecodeStep, HeadGroup, HeadPolicy, Step, option, register_policy
from .static_buffers import allocate_static

POSITION_RULES = ("original", "cache")  # each key at its place in the sequence, or within the cache


@register_policy
@dataclass(frozen=True)
class SinkWindow(HeadPolicy):
    name = "sink_window"
    sink: int = 64
    recent: int = 256
    positions: str = option("original")

    def __post_init__(self):
        super().__post_init__()
        if self.positions not in POSITION_RULES:
            raise PlanError(
                f"sink_window: positions must be 'original' (each key at its place in the sequence) or 'cache' "
                f"(within the cache, StreamingLLM), got {self.positions!r}"
            )

    @property
    def cache_positions(self) -> bool:
        return self.positions == "cache"

    def sees(self, q_rank: torch.Tensor, k_rank: torch.Tensor) -> torch.Tensor:
        """Attention visibility, elementwise (broadcasting): the key is real, not after the query, and
        among the first `sink` or the last `recent` up to it. Used in dense masks and FlexAttention."""
        return (q_rank >= 0) & (k_rank <= q_rank) & R.in_sink_or_recent(k_rank, q_rank, self.sink, self.recent)

    def keeps(self, k_rank, real_total, score=None):
        """What the next query could still see: sinks and the last `recent` of `real_total` tokens."""
        return R.in_sink_or_recent(k_rank, real_total[..., None] - 1, self.sink, self.recent)

    @property
    def full_attention_prefix(self) -> int:
        return self.capacity  # the first sink + recent tokens see and keep every token before them

    def make_group(self, kv_heads, rep, max_length=None):
        if max_length is None:
            return SinkWindowGroup(self, kv_heads, rep)
        return StaticSinkWindowGroup(self, kv_heads, rep)


def widened(values: torch.Tensor) -> torch.Tensor:
    """Values with zeros to the width of keys that see positions within the cache: sdpa's fast CPU kernel
    takes one width only and falls back to one 2.5x slower otherwise (measured: 94 vs 239 ms for 1,024
    queries over 2,048 keys, 60 ms at the head's own width). One-token decode keeps the narrow values."""
    return torch.cat([values, torch.zeros_like(values)], dim=-1)


def kept_ranks_after(context: int, sink: int, recent: int) -> torch.Tensor:
    """Ranks a sink-window head holds after `context` real tokens, ascending. [min(context, sink + recent)]"""
    ranks = torch.arange(context)
    return ranks[R.in_sink_or_recent(ranks, context - 1, sink, recent)]


class SinkWindowGroup(HeadGroup):
    """Stores exactly min(T, sink + recent) slots per row."""

    policy: SinkWindow

    def attend(self, q, k, v, step: Step):
        if q.shape[2] == 1 and self.k is not None and step.all_valid:
            self._insert_one(k, v, step.new_ranks[:, 0])
            q, keys = self._scored(q, self.k, step.new_ranks, self.rank, step)
            return decode_sdpa(q, keys, self.v, (self.rank >= 0)[:, None, None, :], step.scaling)
        return self._attend_chunk(q, k, v, step)

    def _scored(self, q, keys, q_rank, k_rank, step) -> tuple[torch.Tensor, torch.Tensor]:
        """The queries and keys to score with: as they are, or seeing positions within the cache."""
        if not self.policy.cache_positions:
            return q, keys
        sink, capacity = self.policy.sink, self.policy.capacity
        return cache_position_view(q, keys, q_rank, k_rank, sink, capacity, step.position_base, step.rotation)

    def _attention(self, q, keys, values, k_rank, step) -> torch.Tensor:
        """The pass's queries over `keys` (stored slots and the pass's tokens) under the policy."""
        scored_q, scored_keys = self._scored(q, keys, step.new_ranks, k_rank, step)
        wide = scored_keys.shape[-1] != values.shape[-1]
        scored_values = widened(values) if wide else values
        out = sink_window_attention(
            scored_q, scored_keys, scored_values, step.new_ranks, k_rank, self.policy, step.scaling
        )
        return out[..., : values.shape[-1]] if wide else out

    def shift_positions(self, delta: torch.Tensor, rotation) -> None:
        """The stream's position base moved up by delta [B]: window keys move back with it (sinks stay)."""
        if not self.policy.cache_positions:
            super().shift_positions(delta, rotation)  # refused: original positions cannot move
        if self.k is not None:
            shift_recent_keys(self.k, self.rank, self.policy.sink, delta, rotation)

    def _insert_one(self, k, v, rank):  # k [B, G, 1, D], rank [B]
        sink, capacity = self.policy.sink, self.policy.capacity
        if self.k.shape[2] < capacity and bool((self.rank >= 0).all(-1).any()):
            b, g, _, d = self.k.shape
            self.k = torch.cat([self.k, self.k.new_zeros(b, g, 1, d)], dim=2)
            self.v = torch.cat([self.v, self.v.new_zeros(b, g, 1, d)], dim=2)
            self.rank = torch.cat([self.rank, self.rank.new_full((b, 1), -1)], dim=1)
        big = torch.iinfo(self.rank.dtype).max
        order_key = torch.where(self.rank < 0, -1, torch.where(self.rank < sink, big, self.rank))
        slot = order_key.argmin(-1)  # first empty slot, else the oldest window token
        index = slot[:, None, None, None].expand(-1, self.k.shape[1], 1, self.k.shape[3])
        self.k.scatter_(2, index, k)
        self.v.scatter_(2, index, v)
        self.rank.scatter_(1, slot[:, None], rank[:, None])

    def _attend_chunk(self, q, k, v, step):
        """Attend the chunk to the stored slots and itself, then keep only sink + recent."""
        keys, values, ranks = self._with_new(k, v, step)
        out = self._attention(q, keys, values, ranks, step)
        self._keep(keys, values, ranks, step)
        return out

    def store(self, k, v, step: Step):
        self._keep(*self._with_new(k, v, step), step)

    def _with_new(self, k, v, step: Step) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The stored slots and the pass's tokens: keys, values [B, G, S + T, D] and ranks [B, S + T]."""
        if self.k is None:
            self.k, self.v = k[:, :, :0], v[:, :, :0]
            self.rank = step.new_ranks[:, :0]
        keys, values = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        return keys, values, torch.cat([self.rank, step.new_ranks], dim=1)

    def _keep(self, keys, values, ranks, step: Step) -> None:
        """Hold only the sink and the recent tokens of `keys`/`values`, compacted."""
        keep = self.policy.keeps(ranks, step.real_after)
        order, count = R.compact_order(keep)
        index = order[:, :count]
        self.k, self.v = R.gather_slots(keys, index), R.gather_slots(values, index)
        self.rank = torch.where(R.gather_slots(keep, index), R.gather_slots(ranks, index), -1)

    def fill(self, batch, context, head_dim, dtype, device):
        ranks = kept_ranks_after(context, self.policy.sink, self.policy.recent).to(device)
        self.k = torch.randn(batch, self.num_kv, len(ranks), head_dim, dtype=dtype, device=device)
        self.v = torch.randn_like(self.k)
        self.rank = ranks.expand(batch, -1).clone()


class StaticSinkWindowGroup(SinkWindowGroup):
    """A fixed ring buffer of sink + recent slots: rank r lives in slot `ring_slot(r)`, so a
    decode step writes one slot it can compute from the rank alone (no search, no sync)."""

    store = HeadGroup.store  # static caches take no prefix (StaticDuoCacheLayer.store_prefix)

    def ring_slot(self, rank: torch.Tensor) -> torch.Tensor:
        sink, recent = self.policy.sink, self.policy.recent
        return torch.where(rank < sink, rank, sink + (rank - sink) % recent)

    def _allocate(self, like: torch.Tensor) -> None:
        capacity = self.policy.capacity
        self.k, self.v = allocate_static(like, capacity), allocate_static(like, capacity)
        self.rank = allocate_static(like.new_empty(like.shape[0], 1, dtype=torch.long), capacity, -1)

    def attend(self, q, k, v, step: Step):
        if self.k is None:
            self._allocate(k)
        keys, values = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        ranks = torch.cat([self.rank, step.new_ranks], dim=1)
        out = self._attention(q, keys, values, ranks, step)
        keep = self.policy.keeps(ranks, step.real_after)
        self._store(keys, values, ranks, keep)
        return out

    def _store(self, keys, values, ranks, keep) -> None:
        """Move the kept slots to their ring slots; the rest go to a spare column that is dropped."""
        capacity = self.policy.capacity
        slot = torch.where(keep, self.ring_slot(ranks.clamp(min=0)), capacity)  # [B, S]
        for buffer, source in ((self.k, keys), (self.v, values)):
            spread = source.new_zeros(*source.shape[:2], capacity + 1, source.shape[3])
            spread.scatter_(2, slot[:, None, :, None].expand_as(source), source)
            buffer.copy_(spread[:, :, :capacity])
        spread_rank = ranks.new_full((ranks.shape[0], capacity + 1), -1)
        spread_rank.scatter_(1, slot, torch.where(keep, ranks, -1))
        self.rank.copy_(spread_rank[:, :capacity])

    def decode(self, q, k, v, step: DecodeStep):
        slot = self.ring_slot(step.new_rank.clamp(min=0))  # [B]
        valid = step.new_valid
        index = slot[:, None, None, None].expand(-1, self.k.shape[1], 1, self.k.shape[3])
        for buffer, new in ((self.k, k), (self.v, v)):
            buffer.scatter_(2, index, torch.where(valid[:, None, None, None], new, buffer.gather(2, index)))
        old_rank = self.rank.gather(1, slot[:, None])
        self.rank.scatter_(1, slot[:, None], torch.where(valid[:, None], step.new_rank[:, None], old_rank))
        q, keys = self._scored(q, self.k, step.new_rank[:, None], self.rank, step)
        return decode_sdpa(q, keys, self.v, (self.rank >= 0)[:, None, None, :], step.scaling)

    def fill(self, batch, context, head_dim, dtype, device):
        self._allocate(torch.empty(batch, self.num_kv, 1, head_dim, dtype=dtype, device=device))
        ranks = kept_ranks_after(context, self.policy.sink, self.policy.recent).to(device)
        slots = self.ring_slot(ranks)
        self.k[:, :, slots] = torch.randn(batch, self.num_kv, len(ranks), head_dim, dtype=dtype, device=device)
        self.v[:, :, slots] = torch.randn(batch, self.num_kv, len(ranks), head_dim, dtype=dtype, device=device)
        self.rank[:, slots] = ranks

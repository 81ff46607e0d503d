"""Storage and attention for one group of KV heads that share a policy, within one layer.

Each group owns its tensors `k`, `v` of shape [B, G, S, D] (G = the group's KV heads) and
attends its query heads (R per KV head) to them. A group only ever stores what its policy
keeps: `full` every token, `sink_window` at most sink + recent, `h2o` / `sink_h2o` at most
their budget (one extra slot exists for the length of a decode step, while the new token is
scored, before eviction).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch

from . import kernels as K
from .policies import H2O, Full, HeadPolicy, SinkH2O, SinkWindow
from .step import Step

FULL_SLACK = 1 / 64  # full heads grow their buffer by ~1.6% at a time instead of copying every step
FULL_ALIGN = 8
ATTENTION_BLOCK_ELEMENTS = 1 << 22  # logits per block in H2O prefill (16 MiB in fp32)
WINDOW_QUERY_BLOCK = 128  # queries per block in streaming prefill: each sees <= stored + sink + recent + block keys (128 measured fastest at 8k)


def full_capacity(needed: int, first: bool) -> int:
    """Slots a full group allocates to hold `needed` tokens (exact on the first pass)."""
    return needed if first else needed + max(FULL_ALIGN, math.ceil(needed * FULL_SLACK))


def _query_block(t: int, keys: int, rows_per_token: int) -> int:
    return max(1, min(t, ATTENTION_BLOCK_ELEMENTS // max(1, keys * rows_per_token)))


class HeadGroup(ABC):
    policy: HeadPolicy

    def __init__(self, policy: HeadPolicy, kv_heads: list[int], rep: int):
        self.policy, self.kv_heads, self.rep = policy, kv_heads, rep
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def num_kv(self) -> int:
        return len(self.kv_heads)

    def nbytes(self) -> int:
        """Bytes of the key and value tensors this group holds (allocated, slack included)."""
        return 0 if self.k is None else self.k.nbytes + self.v.nbytes

    def stored_tokens(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def select_batch(self, index: torch.Tensor) -> None:
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor) and value.ndim >= 2:
                setattr(self, name, value.index_select(0, index.to(value.device)))

    @abstractmethod
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: Step) -> torch.Tensor:
        """q [B, G*R, T, D], k/v [B, G, T, D] for the new tokens -> output [B, G*R, T, D]."""


class FullGroup(HeadGroup):
    """Every token, padding included (masked), in a buffer that grows geometrically."""

    def __init__(self, policy, kv_heads, rep):
        super().__init__(policy, kv_heads, rep)
        self.length = 0

    def stored_tokens(self) -> int:
        return self.length

    def _append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        needed = self.length + k.shape[2]
        if self.k is None or needed > self.k.shape[2]:
            capacity = full_capacity(needed, first=self.k is None)
            new_k = k.new_empty(*k.shape[:2], capacity, k.shape[3])
            new_v = v.new_empty(*v.shape[:2], capacity, v.shape[3])
            if self.k is not None:
                new_k[:, :, : self.length] = self.k[:, :, : self.length]
                new_v[:, :, : self.length] = self.v[:, :, : self.length]
            self.k, self.v = new_k, new_v
        self.k[:, :, self.length : needed] = k
        self.v[:, :, self.length : needed] = v
        self.length = needed

    def attend(self, q, k, v, step):
        self._append(k, v)
        keys, values = self.k[:, :, : self.length], self.v[:, :, : self.length]
        t = q.shape[2]
        pad = None if step.pad_mask is None else step.pad_mask[:, None, None, : self.length]
        if t == 1:
            out, _ = K.attention(K.gqa_queries(q, self.num_kv), keys, values, pad, step.scaling)
            return K.gqa_outputs(out, q.shape[1])
        if pad is None and step.seen_before == 0:
            return torch.nn.functional.scaled_dot_product_attention(
                q, keys, values, is_causal=True, scale=step.scaling, enable_gqa=True
            )
        positions = torch.arange(self.length, device=q.device)
        causal = positions[None, :] <= (step.seen_before + torch.arange(t, device=q.device))[:, None]
        mask = causal[None, None] if pad is None else causal[None, None] & pad
        mask = mask | ~mask.any(-1, keepdim=True)  # padding queries: nothing to attend, output unused
        return torch.nn.functional.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=step.scaling, enable_gqa=True
        )


class SinkWindowGroup(HeadGroup):
    """StreamingLLM heads: the first `sink` real tokens and the last `recent`, nothing else.

    `rank` [B, S] holds each slot's real-token rank (-1 empty); all heads of the group keep the
    same tokens. Slots are unordered (keys carry their position through RoPE): a decode step
    overwrites the oldest window slot in place.
    """

    policy: SinkWindow

    def __init__(self, policy, kv_heads, rep):
        super().__init__(policy, kv_heads, rep)
        self.rank: torch.Tensor | None = None

    def attend(self, q, k, v, step):
        if q.shape[2] == 1 and self.k is not None and step.all_valid:
            self._insert_one(k, v, step.new_ranks[:, 0])
            mask = (self.rank >= 0)[:, None, None, :]
            out, _ = K.attention(K.gqa_queries(q, self.num_kv), self.k, self.v, mask, step.scaling)
            return K.gqa_outputs(out, q.shape[1])
        return self._attend_chunk(q, k, v, step)

    def _insert_one(self, k, v, rank):  # k [B, G, 1, D], rank [B]
        sink, budget = self.policy.sink, self.policy.budget
        if self.k.shape[2] < budget and bool((self.rank >= 0).all(-1).any()):
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
        if self.k is None:
            self.k, self.v = k[:, :, :0], v[:, :, :0]
            self.rank = step.new_ranks[:, :0]
        keys = torch.cat([self.k, k], dim=2)
        values = torch.cat([self.v, v], dim=2)
        ranks = torch.cat([self.rank, step.new_ranks], dim=1)
        out = self._blocked_attention(q, keys, values, ranks, step)
        keep = K.sink_window_keep(ranks, step.real_after, self.policy.sink, self.policy.recent)
        order, count = K.compact_order(keep)
        index = order[:, :count]
        self.k, self.v = K.gather_slots(keys, index), K.gather_slots(values, index)
        self.rank = torch.where(K.gather_slots(keep, index), K.gather_slots(ranks, index), -1)
        return out

    def _blocked_attention(self, q, keys, values, ranks, step):
        """Each query block sees the stored slots, the chunk's sink tokens and its own window."""
        sink, recent = self.policy.sink, self.policy.recent
        prev, t = self.k.shape[2], q.shape[2]
        q_rank = step.new_ranks
        in_sink = ((q_rank >= 0) & (q_rank < sink)).any(0)
        sink_end = int(in_sink.nonzero().max().item()) + 1 if bool(in_sink.any()) else 0
        n_pad = int((q_rank < 0).sum(1).max().item())
        block = WINDOW_QUERY_BLOCK
        outs = []
        for i0 in range(0, t, block):
            i1 = min(t, i0 + block)
            lo = max(0, i0 - recent + 1 - n_pad)
            parts = [torch.arange(prev)]
            parts += [prev + torch.arange(i1)] if lo <= sink_end else [prev + torch.arange(sink_end), prev + torch.arange(lo, i1)]
            idx = torch.cat(parts).to(keys.device)
            mask = K.sink_window_mask(q_rank[:, i0:i1], ranks.index_select(1, idx), sink, recent)
            mask = K.expand_mask_over_heads(mask[:, None], self.rep)
            qb = K.gqa_queries(q[:, :, i0:i1], self.num_kv)
            ob, _ = K.attention(qb, keys.index_select(2, idx), values.index_select(2, idx), mask, step.scaling)
            outs.append(K.gqa_outputs(ob, q.shape[1]))
        return torch.cat(outs, dim=2)


class H2OGroup(HeadGroup):
    """Heavy-hitter oracle heads (H2O, arXiv 2306.14048; FMInference/H2O `utils_real_drop`).

    Per head: the last `recent` real tokens, plus (`sink_h2o`) the first `sink`, plus the
    `heavy` others with the largest attention mass accumulated over every query so far, summed
    over the query heads of the KV group. A pass appends its tokens, attends over everything
    stored (causally within the pass), adds each query's probabilities to the scores, then
    evicts down to the budget. `rank` and `score` are [B, G, S]: each head keeps its own set.
    A decode step needs no copy: the new token overwrites the evicted slot (slots are unordered).
    """

    policy: H2O | SinkH2O

    def __init__(self, policy, kv_heads, rep):
        super().__init__(policy, kv_heads, rep)
        self.rank: torch.Tensor | None = None
        self.score: torch.Tensor | None = None

    @property
    def sink(self) -> int:
        return getattr(self.policy, "sink", 0)

    def attend(self, q, k, v, step):
        b, g, t, _ = k.shape
        if self.k is None:
            self.k, self.v = k[:, :, :0], v[:, :, :0]
            self.rank = k.new_zeros(b, g, 0, dtype=torch.long)
            self.score = k.new_zeros(b, g, 0, dtype=torch.float32)
        elif t == 1 and step.all_valid:
            return self._decode_one(q, k, v, step)
        prev = self.k.shape[2]
        self.k, self.v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        self.rank = torch.cat([self.rank, step.new_ranks[:, None, :].expand(b, g, t)], dim=2)
        self.score = torch.cat([self.score, self.score.new_zeros(b, g, t)], dim=2)
        out = self._attend_and_score(q, prev, step)
        self._evict(step.real_after)
        return out

    def _decode_one(self, q, k, v, step):
        """One new token: attend over stored + new, score, then overwrite the evicted slot in place."""
        qg = K.gqa_queries(q, self.num_kv).float()  # [B, G, R, D]
        stored = torch.matmul(qg, self.k.float().transpose(-1, -2)) * step.scaling  # [B, G, R, S]
        stored = stored.masked_fill((self.rank < 0)[:, :, None, :], float("-inf"))
        new = (qg * k.float()).sum(-1, keepdim=True) * step.scaling  # [B, G, R, 1]
        probs = torch.softmax(torch.cat([stored, new], dim=-1), dim=-1)
        old_p, new_p = probs[..., :-1], probs[..., -1:]
        out = torch.matmul(old_p.to(self.v.dtype), self.v) + new_p.to(v.dtype) * v
        mass = probs.sum(2)  # [B, G, S + 1]: summed over the group's query heads
        self.score += mass[..., :-1]
        if self.k.shape[2] < self.policy.budget and bool((self.rank >= 0).all(-1).any()):
            self._grow_one_slot()
        priority = K.h2o_priority(self.score, self.rank, step.real_after, self.sink, self.policy.recent)
        slot = priority.argmin(-1, keepdim=True)  # an empty slot, else the lowest-scoring evictable token
        index = slot[..., None].expand(-1, -1, 1, self.k.shape[3])
        self.k.scatter_(2, index, k)
        self.v.scatter_(2, index, v)
        self.rank.scatter_(2, slot, step.new_ranks[:, None, :].expand_as(slot))
        self.score.scatter_(2, slot, mass[..., -1:])
        return K.gqa_outputs(out, q.shape[1])

    def _grow_one_slot(self):
        b, g, _, d = self.k.shape
        self.k = torch.cat([self.k, self.k.new_zeros(b, g, 1, d)], dim=2)
        self.v = torch.cat([self.v, self.v.new_zeros(b, g, 1, d)], dim=2)
        self.rank = torch.cat([self.rank, self.rank.new_full((b, g, 1), -1)], dim=2)
        self.score = torch.cat([self.score, self.score.new_zeros(b, g, 1)], dim=2)

    def _attend_and_score(self, q, prev, step):
        t = q.shape[2]
        q_rank = step.new_ranks[:, None, :]  # [B, 1, T]
        block = _query_block(t, self.k.shape[2], self.rep)
        outs = []
        for i0 in range(0, t, block):
            i1 = min(t, i0 + block)
            end = prev + i1  # keys after the block's last query are masked anyway
            mask = K.causal_rank_mask(q_rank[..., i0:i1], self.rank[..., :end])
            mask = K.expand_mask_over_heads(mask, self.rep)
            qb = K.gqa_queries(q[:, :, i0:i1], self.num_kv)
            ob, probs = K.attention(qb, self.k[:, :, :end], self.v[:, :, :end], mask, step.scaling, want_probs=True)
            self.score[..., :end] += probs.sum(2)
            outs.append(K.gqa_outputs(ob, q.shape[1]))
        return torch.cat(outs, dim=2)

    def _evict(self, real_after):
        priority = K.h2o_priority(self.score, self.rank, real_after, self.sink, self.policy.recent)
        keep = K.h2o_keep_slots(priority, self.policy.budget)
        if keep is None:
            return
        self.k, self.v = K.gather_slots(self.k, keep), K.gather_slots(self.v, keep)
        self.rank, self.score = K.gather_slots(self.rank, keep), K.gather_slots(self.score, keep)


GROUP_CLASSES = {Full: FullGroup, SinkWindow: SinkWindowGroup, H2O: H2OGroup, SinkH2O: H2OGroup}


def make_group(policy: HeadPolicy, kv_heads: list[int], rep: int) -> HeadGroup:
    return GROUP_CLASSES[type(policy)](policy, kv_heads, rep)

"""Heavy hitters: a head keeps the slots its queries attended to most, plus protected ones (the rule
of `h2o`, `sink_h2o` and `snapkv`), in unordered slots with a rank and an accumulated score each.

A pass appends its tokens, attends over everything stored (causally within the pass), adds each
query's probabilities to the scores, then evicts down to the policy's capacity. `rank` and `score`
are [B, G, S]: each head keeps its own set. A decode step needs no copy: the new token overwrites
the evicted slot (slots are unordered). h2o.py holds H2O itself and its slots stored as codes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..attention import dense as DA
from ..attention import ranks as R
from ..attention.scored import attention_with_mass
from .base import DecodeStep, HeadGroup, HeadPolicy, Step
from .static_buffers import allocate_static


@dataclass(frozen=True)
class HeavyHitterPolicy(HeadPolicy):
    """The rule of `h2o` and `sink_h2o` (fields `heavy`, `recent`, and `sink` for sink_h2o): the
    last `recent` and the first `sinks_kept` real tokens are never evicted; the other kept slots are
    the `heavy` with the largest accumulated attention. Not a policy by itself (not registered).
    It evicts after every pass, so a prompt prefilled in chunks keeps other tokens than in one pass."""

    chunking_changes_result = True

    @property
    def sinks_kept(self) -> int:
        return 0

    def protected(self, k_rank: torch.Tensor, real_total: torch.Tensor) -> torch.Tensor:
        """[..., S] slots never evicted once `real_total` [...] real tokens were seen."""
        return R.in_sink_or_recent(k_rank, real_total[..., None] - 1, self.sinks_kept, self.recent)

    def priority(self, score: torch.Tensor, k_rank: torch.Tensor, real_total: torch.Tensor) -> torch.Tensor:
        """Eviction priority (higher is kept): +inf protected, accumulated score, -inf empty. [..., S]."""
        prio = torch.where(self.protected(k_rank, real_total), torch.full_like(score, float("inf")), score)
        return torch.where(k_rank >= 0, prio, torch.full_like(score, float("-inf")))

    def keep_slots(self, priority: torch.Tensor) -> torch.Tensor | None:
        """The `capacity` slots of highest priority, in slot order; None when nothing goes.

        [..., S] -> [..., S'] with S' = min(capacity, most real tokens of any row and head): empty
        slots (priority -inf) are dropped first, so padding is never kept.
        """
        count = min(self.capacity, int((priority > float("-inf")).sum(-1).max().item()))
        if count == priority.shape[-1]:
            return None
        return priority.topk(count, dim=-1).indices.sort(dim=-1).values

    def keeps(self, k_rank, real_total, score=None):
        if score is None:
            raise ValueError(f"{self.name} keeps tokens by accumulated attention: pass score")
        priority = self.priority(score, k_rank, real_total)
        kept = self.keep_slots(priority)
        if kept is None:
            return k_rank >= 0
        return torch.zeros_like(k_rank, dtype=torch.bool).scatter_(-1, kept, True) & (k_rank >= 0)

    def make_group(self, kv_heads, rep, max_length=None):
        return H2OGroup(self, kv_heads, rep) if max_length is None else StaticH2OGroup(self, kv_heads, rep)


class H2OGroup(HeadGroup):
    """Stores at most `capacity` slots per head (one more during a decode step, before eviction)."""

    policy: HeavyHitterPolicy
    stores_codes = False  # slots hold rows of codes (QuantizedH2OGroup)

    def __init__(self, policy, kv_heads, rep):
        super().__init__(policy, kv_heads, rep)
        self.score: torch.Tensor | None = None

    def attend(self, q, k, v, step: Step):
        if self.k is not None and q.shape[2] == 1 and step.all_valid:
            if self.k.shape[2] < self.policy.capacity and bool((self.rank >= 0).all(-1).any()):
                self._grow_one_slot()
            return self._decode_in_place(q, k, v, step.new_ranks[:, 0], None, step.real_after, step.scaling)
        return self._attend_chunk(q, k, v, step)

    def _readable(self, stored: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Stored keys or values as attention reads them ([B, G, S, D], typed like the new `like`);
        storage as it is in 16 bits."""
        return stored

    def _stored_form(self, x: torch.Tensor) -> torch.Tensor:
        """New keys or values [B, G, T, D] as the slots store them."""
        return x

    def _attend_chunk(self, q, k, v, step: Step):
        b, g, t, _ = k.shape
        if self.k is None:
            self.k, self.v = self._stored_form(k[:, :, :0]), self._stored_form(v[:, :, :0])
            self.rank = k.new_zeros(b, g, 0, dtype=torch.long)
            self.score = k.new_zeros(b, g, 0, dtype=torch.float32)
        old_k, old_v = self.k, self.v
        self.k = torch.cat([old_k, self._stored_form(k)], dim=2)
        self.v = torch.cat([old_v, self._stored_form(v)], dim=2)
        keys, values = self.k, self.v  # 16 bits: attention reads the storage itself
        if self.stores_codes:  # the stored slots decoded, the pass's own tokens as they came
            keys = torch.cat([self._readable(old_k, k), k], dim=2)
            values = torch.cat([self._readable(old_v, v), v], dim=2)
        self.rank = torch.cat([self.rank, step.new_ranks[:, None, :].expand(b, g, t)], dim=2)
        self.score = torch.cat([self.score, self.score.new_zeros(b, g, t)], dim=2)
        out = self._attend_and_score(q, keys, values, step)
        self._evict(step.real_after)
        return out

    @staticmethod
    def _first_unpadded_pass(q, keys, step: Step) -> bool:
        """No earlier slots and no padding: key i is the pass's token i."""
        return keys.shape[2] == q.shape[2] and step.all_valid

    def _attend_and_score(self, q, keys, values, step: Step):
        first_pass = self._first_unpadded_pass(q, keys, step)
        out, mass = attention_with_mass(q, keys, values, step.new_ranks, self.rank, step.scaling, first_pass)
        self.score += mass
        return out

    def _decode_in_place(self, q, k, v, new_rank, valid, real_after, scaling):
        """One new token per row (rank [B]; `valid` [B], or None when every row's token is real):
        attend over stored + new, score, then overwrite the lowest-priority slot (an empty one
        first) with it. No shape depends on data."""
        qg = DA.gqa_queries(q, self.num_kv).float()  # [B, G, R, D]
        stored = self._stored_scores(qg, k) * scaling  # [B, G, R, S]
        stored = stored.masked_fill((self.rank < 0)[:, :, None, :], float("-inf"))
        new = (qg * k.float()).sum(-1, keepdim=True) * scaling  # [B, G, R, 1]
        if valid is not None:  # a padding token attends nothing real: finite, so no row is all -inf
            new = new.masked_fill(~valid[:, None, None, None], -1e30)
        probs = torch.softmax(torch.cat([stored, new], dim=-1), dim=-1)
        old_p, new_p = probs[..., :-1], probs[..., -1:]
        out = self._stored_output(old_p, v) + new_p.to(v.dtype) * v
        mass = probs.sum(2)  # [B, G, S + 1]: summed over the group's query heads
        if valid is not None:
            mass = mass * valid[:, None, None]  # padding queries add no attention mass
        self.score += mass[..., :-1]
        priority = self.policy.priority(self.score, self.rank, real_after[:, None])
        slot = priority.argmin(-1, keepdim=True)  # [B, G, 1]: an empty slot, else the lowest-scoring evictable
        rank = new_rank[:, None, None].expand_as(slot)
        self._write_slot(slot, self._stored_form(k), self._stored_form(v), rank, mass[..., -1:], valid)
        return DA.gqa_outputs(out, q.shape[1])

    def _stored_scores(self, qg: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """qg [B, G, R, D] (fp32) against every stored slot's key -> [B, G, R, S], unscaled."""
        return torch.matmul(qg, self.k.float().transpose(-1, -2))

    def _stored_output(self, p: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """p [B, G, R, S] times the stored values -> [B, G, R, D] in `like`'s dtype."""
        return torch.matmul(p.to(self.v.dtype), self.v)

    def _write_slot(self, slot, k, v, rank, score, valid) -> None:
        """Put the new token in `slot` [B, G, 1] (rows whose token is padding keep the old one)."""
        index = slot[..., None].expand(-1, -1, 1, self.k.shape[3])
        updates = ((self.k, index, k), (self.v, index, v), (self.rank, slot, rank), (self.score, slot, score))
        for buffer, where, new in updates:
            if valid is not None:
                keep = ~valid.view(-1, *([1] * (new.ndim - 1)))
                new = torch.where(keep, buffer.gather(2, where), new)
            buffer.scatter_(2, where, new)

    def _grow_one_slot(self):
        b, g, _, d = self.k.shape
        self.k = torch.cat([self.k, self.k.new_zeros(b, g, 1, d)], dim=2)
        self.v = torch.cat([self.v, self.v.new_zeros(b, g, 1, d)], dim=2)
        self.rank = torch.cat([self.rank, self.rank.new_full((b, g, 1), -1)], dim=2)
        self.score = torch.cat([self.score, self.score.new_zeros(b, g, 1)], dim=2)

    def _evict(self, real_after):
        keep = self.policy.keep_slots(self.policy.priority(self.score, self.rank, real_after[:, None]))
        if keep is None:
            return
        self.k, self.v = R.gather_slots(self.k, keep), R.gather_slots(self.v, keep)
        self.rank, self.score = R.gather_slots(self.rank, keep), R.gather_slots(self.score, keep)

    def fill(self, batch, context, head_dim, dtype, device):
        kept = self.policy.tokens_kept(context)
        self.k = self._stored_form(torch.randn(batch, self.num_kv, kept, head_dim, dtype=dtype, device=device))
        self.v = self._stored_form(torch.randn(batch, self.num_kv, kept, head_dim, dtype=dtype, device=device))
        self.rank = torch.arange(context - kept, context, device=device).expand(batch, self.num_kv, kept).clone()
        self.score = torch.rand(batch, self.num_kv, kept, device=device)


class StaticH2OGroup(H2OGroup):
    """`capacity` fixed slots per head; empty slots have rank -1 and are filled first."""

    def attend(self, q, k, v, step: Step):
        out = self._attend_chunk(q, k, v, step)  # compacts to <= capacity slots
        self._pad_to_capacity()
        return out

    def _pad_to_capacity(self) -> None:
        capacity, held = self.policy.capacity, self.k.shape[2]
        k, v, rank, score = self.k, self.v, self.rank, self.score
        self.k, self.v = allocate_static(k, capacity), allocate_static(v, capacity)
        self.rank, self.score = allocate_static(rank, capacity, -1), allocate_static(score, capacity)
        for buffer, source in ((self.k, k), (self.v, v), (self.rank, rank), (self.score, score)):
            buffer[:, :, :held] = source

    def decode(self, q, k, v, step: DecodeStep):
        return self._decode_in_place(q, k, v, step.new_rank, step.new_valid, step.real_after, step.scaling)

    def fill(self, batch, context, head_dim, dtype, device):
        super().fill(batch, context, head_dim, dtype, device)
        self._pad_to_capacity()

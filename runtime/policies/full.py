"""`full`: a retrieval head keeps every token (DuoAttention's retrieval heads).

Dynamic storage grows a buffer by ~1.6% at a time instead of copying the whole cache every step
as transformers' DynamicCache does; static storage preallocates `max_length` slots. Attention is
sdpa (flash where the device has it) in the layout transformers uses: query heads [B, G*R, T, D]
over keys [B, G, S, D] with `enable_gqa`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..dense_attention import decode_sdpa, sdpa
from .base import DecodeStep, HeadGroup, HeadPolicy, Step, register_policy
from .static_buffers import allocate_static, check_room

FULL_SLACK = 1 / 64  # dynamic buffers grow by ~1.6% at a time
FULL_ALIGN = 8


def full_capacity(needed: int, first: bool) -> int:
    """Slots a dynamic full group allocates to hold `needed` tokens (exact on the first pass)."""
    return needed if first else needed + max(FULL_ALIGN, math.ceil(needed * FULL_SLACK))


@register_policy
@dataclass(frozen=True)
class Full(HeadPolicy):
    name = "full"
    bounded = False

    def keeps(self, k_rank, real_total, score=None):
        return k_rank >= 0

    def make_group(self, kv_heads, rep, max_length=None):
        if max_length is None:
            return FullGroup(self, kv_heads, rep)
        return StaticFullGroup(self, kv_heads, rep, max_length)


class FullGroup(HeadGroup):
    """Every token, padding included (masked), in a buffer that grows geometrically."""

    def __init__(self, policy, kv_heads, rep):
        super().__init__(policy, kv_heads, rep)
        self.length = 0

    def stored_tokens(self) -> int:
        return self.length

    def kept_ranks(self, row, head):
        raise ValueError("full heads keep every token; kept ranks are tracked for bounded heads")

    def decode(self, q, k, v, step):
        raise NotImplementedError("a dynamic full group has no static decode; make the cache with max_length")

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

    def attend(self, q, k, v, step: Step):
        self._append(k, v)
        keys, values = self.k[:, :, : self.length], self.v[:, :, : self.length]
        t = q.shape[2]
        pad = None if step.pad_mask is None else step.pad_mask[:, None, None, : self.length]
        if t == 1:
            return decode_sdpa(q, keys, values, pad, step.scaling)
        if pad is None and step.seen_before == 0:
            return sdpa(q, keys, values, None, step.scaling, causal=True)
        positions = torch.arange(self.length, device=q.device)
        causal = positions[None, :] <= (step.seen_before + torch.arange(t, device=q.device))[:, None]
        return sdpa(q, keys, values, causal[None, None] if pad is None else causal[None, None] & pad, step.scaling)

    def fill(self, batch, context, head_dim, dtype, device):
        self.k = torch.randn(batch, self.num_kv, context, head_dim, dtype=dtype, device=device)
        self.v = torch.randn_like(self.k)
        self.length = context


class StaticFullGroup(FullGroup):
    """`max_length` preallocated slots; a token's slot is its position in the padded sequence."""

    def __init__(self, policy, kv_heads, rep, max_length: int):
        super().__init__(policy, kv_heads, rep)
        self.max_length = max_length

    def stored_tokens(self) -> int:
        return 0 if self.k is None else self.max_length

    def _append(self, k, v):
        needed = self.length + k.shape[2]
        check_room(needed, self.max_length)
        if self.k is None:
            self.k, self.v = allocate_static(k, self.max_length), allocate_static(v, self.max_length)
        self.k[:, :, self.length : needed] = k
        self.v[:, :, self.length : needed] = v
        self.length = needed

    def attend(self, q, k, v, step: Step):
        self.length = step.seen_before  # the layer's count: compiled decode steps do not update Python ints
        return super().attend(q, k, v, step)

    def decode(self, q, k, v, step: DecodeStep):
        self.k.index_copy_(2, step.position.view(1), k)
        self.v.index_copy_(2, step.position.view(1), v)
        written = torch.arange(self.max_length, device=q.device) <= step.position  # [N]
        mask = written if step.pad_mask is None else written & step.pad_mask  # [N] or [B, N]
        return decode_sdpa(q, self.k, self.v, mask.view(-1, 1, 1, self.max_length), step.scaling)

    def fill(self, batch, context, head_dim, dtype, device):
        like = torch.empty(batch, self.num_kv, 1, head_dim, dtype=dtype, device=device)
        self.k, self.v = allocate_static(like, self.max_length), allocate_static(like, self.max_length)
        self.k[:, :, :context].normal_()
        self.v[:, :, :context].normal_()
        self.length = context

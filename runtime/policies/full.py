"""`full`: a retrieval head keeps every token (DuoAttention's retrieval heads).

Dynamic storage grows a buffer by ~1.6% at a time instead of copying the whole cache every step
as transformers' DynamicCache does; static storage preallocates `max_length` slots. Attention is
sdpa (flash where the device has it) in the layout transformers uses: query heads [B, G*R, T, D]
over keys [B, G, S, D] with `enable_gqa`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from ..attention.dense import attend_every_slot, decode_sdpa
from ..errors import PlanError
from ..quant.codes import GROUP, RESIDUAL, check_code_head_dim, check_code_sizes, quantized_bytes
from .base import DecodeStep, HeadGroup, HeadPolicy, Step, full_slots, register_policy
from .static_buffers import allocate_static, check_room

CODE_DEFAULTS = {"group": GROUP, "residual": RESIDUAL}


@register_policy
@dataclass(frozen=True)
class Full(HeadPolicy):
    """Every token. `kv_bits` 8 or 4 stores them as KIVI codes (quant/codes.py): keys per channel over
    groups of `group` tokens, values per token over groups of `group` channels, the newest
    `residual` or more in full precision. 16 (the default) stores the cache's dtype as it is."""

    name = "full"
    bounded = False
    kv_bits: int = 16
    group: int = GROUP
    residual: int = RESIDUAL

    def __post_init__(self):
        for name, least in (("kv_bits", 1), ("group", 1), ("residual", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise PlanError(f"full: {name} must be an integer of at least {least}, got {value!r}")
        check_code_sizes("full", self.kv_bits, {"group": self.group, "residual": self.residual}, CODE_DEFAULTS)

    @classmethod
    def storing(cls, kv_bits: int = 16, group: int = GROUP) -> Full:
        """Full heads that store `kv_bits` per value (16: the cache's dtype, whatever `group` says)."""
        return cls() if kv_bits == 16 else cls(kv_bits=kv_bits, group=group)

    @property
    def quantized(self) -> bool:
        return self.kv_bits < 16

    @property
    def label(self) -> str:
        return f"full-kv{self.kv_bits}" if self.quantized else "full"

    def sizes(self) -> dict[str, int]:
        return super().sizes() if self.quantized else {}  # a 16-bit full head has no sizes, as before

    @property
    def full_attention_prefix(self) -> int:
        return 0 if self.quantized else sys.maxsize  # codes are not full attention's keys

    def kv_bytes(self, seq_len: int, head_dim: int, dtype_bytes: int) -> int:
        return quantized_bytes(seq_len, head_dim, self.kv_bits, self.group, self.residual, dtype_bytes)

    def check_head_dim(self, head_dim: int) -> None:
        check_code_head_dim("full", self.kv_bits, self.group, head_dim)

    def keeps(self, k_rank, real_total, score=None):
        return k_rank >= 0

    def make_group(self, kv_heads, rep, max_length=None):
        if self.quantized:
            from .full_quantized import QuantizedFullGroup
            from .full_quantized_static import StaticQuantizedFullGroup

            if max_length is None:
                return QuantizedFullGroup(self, kv_heads, rep)
            return StaticQuantizedFullGroup(self, kv_heads, rep, max_length)
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

    def decode(self, q, k, v, step):
        raise NotImplementedError("a dynamic full group has no static decode; make the cache with max_length")

    def _append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        needed = self.length + k.shape[2]
        if self.k is None or needed > self.k.shape[2]:
            slots = full_slots(needed, first=self.k is None)
            new_k = k.new_empty(*k.shape[:2], slots, k.shape[3])
            new_v = v.new_empty(*v.shape[:2], slots, v.shape[3])
            if self.k is not None:
                new_k[:, :, : self.length] = self.k[:, :, : self.length]
                new_v[:, :, : self.length] = self.v[:, :, : self.length]
            self.k, self.v = new_k, new_v
        self.k[:, :, self.length : needed] = k
        self.v[:, :, self.length : needed] = v
        self.length = needed

    def store(self, k, v, step: Step):
        self._append(k, v)

    def attend(self, q, k, v, step: Step):
        self._append(k, v)
        keys, values = self.k[:, :, : self.length], self.v[:, :, : self.length]
        return attend_every_slot(q, keys, values, step.pad_mask, step.seen_before, step.scaling)

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

    store = HeadGroup.store  # static caches take no prefix (StaticDuoCacheLayer.store_prefix)

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

"""Static storage of `full(kv_bits=8|4)` heads: codes preallocated for `max_length`, the residual a ring.

What `torch.compile` needs (fixed addresses, no data-dependent shape, no host sync), with the
dynamic group's numbers: the history as codes of `quantized_tokens(max_length)` tokens plus one
spare group, and the full-precision residual in a ring of `residual + group` slots (position p in
slot p mod ring: the residual never holds more than residual + group - 1 tokens, so no slot is
taken while its token waits). A decode step writes its token to the ring, attends to every quantized
slot (masked past what is quantized, as the static full head masks past what is written) and to the
ring, then codes the group that starts where the codes end: when that group is due it is the one
the dynamic group would code now; when it is not, it lands in slots no mask lets through yet and
is quantized again when due. Prefill passes run the dynamic group's code on the residual read out of
the ring in order, and write what stays back.
"""

from __future__ import annotations

import torch

from ..quant import codes as Q
from ..quant.attention import quantized_attention
from .base import DecodeStep, Step
from .full_quantized import PARTS, QuantizedFullGroup
from .static_buffers import allocate_static


class StaticQuantizedFullGroup(QuantizedFullGroup):
    """`self.k` / `self.v`: the ring of `residual + group` full-precision slots (outside a prefill pass)."""

    def __init__(self, policy, kv_heads, rep, max_length: int):
        super().__init__(policy, kv_heads, rep)
        self.max_length = max_length
        self.ring = policy.residual + policy.group
        self.code_slots = Q.quantized_tokens(max_length, policy.group, policy.residual) + policy.group

    def stored_tokens(self) -> int:
        return 0 if self.k is None else self.code_slots + self.ring

    def _allocate(self, like: torch.Tensor) -> None:
        """Zeroed buffers (a spare slot must hold finite numbers: masked scores still meet its scales)."""
        p, (b, g, _, d) = self.policy, like.shape
        packed = like.new_empty(b, g, 1, d * p.kv_bits // 8, dtype=torch.uint8)
        per_channel = like.new_empty(b, g, 1, d)
        per_group = like.new_empty(b, g, 1, d // p.group)
        for name, template, slots in (
            ("k_codes", packed, self.code_slots),
            ("k_scale", per_channel, self.code_slots // p.group),
            ("k_zero", per_channel, self.code_slots // p.group),
            ("v_codes", packed, self.code_slots),
            ("v_scale", per_group, self.code_slots),
            ("v_zero", per_group, self.code_slots),
        ):
            setattr(self, name, allocate_static(template, slots))
        self.k, self.v = allocate_static(like[:, :, :1], self.ring), allocate_static(like[:, :, :1], self.ring)

    def _ring_slots(self, start: int, stop: int) -> torch.Tensor:
        return torch.arange(start, stop, device=self.k.device) % self.ring

    def _on_residual(self, seen: int, work):
        """Run `work()` with `self.k` / `self.v` the residual in order (positions from the codes' end to
        `seen`), then write the residual it leaves back to the ring."""
        ring_k, ring_v = self.k, self.v
        self.quantized = Q.quantized_tokens(seen, self.policy.group, self.policy.residual)
        held = self._ring_slots(self.quantized, seen)
        self.k, self.v = ring_k.index_select(2, held), ring_v.index_select(2, held)
        try:
            out = work()
            left = self._ring_slots(self.quantized, self.length)
            ring_k.index_copy_(2, left, self.k)
            ring_v.index_copy_(2, left, self.v)
        finally:
            self.k, self.v = ring_k, ring_v
        return out

    def attend(self, q, k, v, step: Step):
        if self.k is None:
            self._allocate(k)
        return self._on_residual(step.seen_before, lambda: super(StaticQuantizedFullGroup, self).attend(q, k, v, step))

    def decode(self, q, k, v, step: DecodeStep):
        p, position = self.policy, step.position
        slot = (position % self.ring).view(1)
        self.k.index_copy_(2, slot, k)
        self.v.index_copy_(2, slot, v)
        quantized = (position - p.residual).clamp(min=0) // p.group * p.group  # tokens quantized before this step
        history = (
            Q.QuantizedKV(self.k_codes, self.k_scale, self.k_zero),
            Q.QuantizedKV(self.v_codes, self.v_scale, self.v_zero),
        )
        masks = self._decode_masks(position, quantized, step.pad_mask)
        out = quantized_attention(q, history, self.k, self.v, masks, step.scaling, p.kv_bits, p.group)
        self._code_group_at(quantized, step.pad_mask)
        return out

    def _decode_masks(self, position, quantized, pad_mask):
        """What a decode query sees: code slots below `quantized`, ring slots holding positions from `quantized` on."""
        device = position.device
        history = torch.arange(self.code_slots, device=device) < quantized  # [C]
        held = position - (position - torch.arange(self.ring, device=device)) % self.ring  # each ring slot's position
        residual = held >= quantized  # [ring]
        if pad_mask is not None:
            pad = pad_mask.bool()
            if pad.shape[1] < self.code_slots:
                pad = torch.nn.functional.pad(pad, (0, self.code_slots - pad.shape[1]))
            history = history & pad[:, : self.code_slots]
            residual = residual & pad.gather(1, held.clamp(min=0).expand(pad.shape[0], -1))
        return history.view(-1, 1, 1, self.code_slots), residual.view(-1, 1, 1, self.ring)

    def _code_group_at(self, quantized, pad_mask) -> None:
        """Code the `group` positions from `quantized` (read from the ring) into their slots."""
        p = self.policy
        positions = quantized + torch.arange(p.group, device=quantized.device)
        slots = positions % self.ring
        valid = None
        if pad_mask is not None:
            valid = pad_mask.index_select(1, positions.clamp(max=pad_mask.shape[1] - 1)).bool()
        keys = Q.quantize_keys(self.k.index_select(2, slots), p.kv_bits, p.group, valid)
        values = Q.quantize_values(self.v.index_select(2, slots), p.kv_bits, p.group)
        group_index = (quantized // p.group).view(1)
        for name, part in zip(
            PARTS, (keys.codes, keys.scale, keys.zero, values.codes, values.scale, values.zero), strict=True
        ):
            getattr(self, name).index_copy_(2, group_index if name in ("k_scale", "k_zero") else positions, part)

    def fill(self, batch, context, head_dim, dtype, device):
        like = torch.empty(batch, self.num_kv, 1, head_dim, dtype=dtype, device=device)
        self._allocate(like)
        keys = torch.randn(batch, self.num_kv, context, head_dim, dtype=dtype, device=device)
        values = torch.randn_like(keys)

        def code_prompt():
            self.quantized, self.k, self.v = 0, keys, values
            self.compress()

        self._on_residual(0, code_prompt)

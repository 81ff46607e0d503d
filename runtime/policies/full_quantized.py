"""Storage of `full(kv_bits=8|4)` heads: KIVI codes for the history, the newest tokens in full precision.

Each pass appends its tokens to the full-precision residual, attends (quant/attention.py: the
history block by block, the residual last, causal), then moves whole groups of the oldest residual
tokens into codes while more than `residual + group` tokens wait. Codes, scales and zero points
grow geometrically as full heads' buffers do. Padding is stored (masked), as full heads store it.
"""

from __future__ import annotations

import torch

from ..attention.dense import attend_every_slot
from ..quant import codes as Q
from ..quant.attention import quantized_attention
from .base import HeadGroup, Step, full_slots

QUERY_BLOCK = 128  # queries of one pass attended at once to quantized history
PARTS = ("k_codes", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero")


class QuantizedFullGroup(HeadGroup):
    """`self.k` / `self.v` hold the full-precision residual; `self.k_codes` ... the quantized history
    (`self.quantized` tokens of it in use, the rest of each buffer is growth slack)."""

    def __init__(self, policy, kv_heads, rep):
        super().__init__(policy, kv_heads, rep)
        self.quantized = 0
        for name in PARTS:
            setattr(self, name, None)

    @property
    def length(self) -> int:
        return self.quantized + (0 if self.k is None else self.k.shape[2])

    def stored_tokens(self) -> int:
        return self.length

    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.state().values())

    def history(self) -> tuple[Q.QuantizedKV, Q.QuantizedKV] | None:
        if not self.quantized:
            return None
        g, n = self.policy.group, self.quantized
        keys = Q.QuantizedKV(self.k_codes[:, :, :n], self.k_scale[:, :, : n // g], self.k_zero[:, :, : n // g])
        values = Q.QuantizedKV(self.v_codes[:, :, :n], self.v_scale[:, :, :n], self.v_zero[:, :, :n])
        return keys, values

    def attend(self, q, k, v, step: Step):
        self.k = k if self.k is None else torch.cat((self.k, k), dim=2)
        self.v = v if self.v is None else torch.cat((self.v, v), dim=2)
        if not self.quantized:  # nothing quantized yet: exactly what a 16-bit full head computes
            out = attend_every_slot(q, self.k, self.v, step.pad_mask, step.seen_before, step.scaling)
        else:
            history, (history_mask, residual_mask) = self.history(), self.masks(q, step)
            p, t = self.policy, q.shape[2]
            out = torch.cat(
                [  # queries in blocks: scores stay [B, G, R * QUERY_BLOCK, keys] however long the pass
                    quantized_attention(
                        q[:, :, i : i + QUERY_BLOCK],
                        history,
                        self.k,
                        self.v,
                        (history_mask, residual_mask[:, :, i : i + QUERY_BLOCK]),
                        step.scaling,
                        p.kv_bits,
                        p.group,
                    )
                    for i in range(0, t, QUERY_BLOCK)
                ],
                dim=2,
            )
        self.compress(step.pad_mask)
        return out

    def masks(self, q, step: Step):
        """Visibility of the history (padding) and of the residual (padding and causal)."""
        n, t, m = self.quantized, q.shape[2], self.k.shape[2]
        pad = step.pad_mask
        history = None if pad is None or n == 0 else pad[:, None, None, :n]
        positions = n + torch.arange(m, device=q.device)
        causal = positions[None, :] <= (step.seen_before + torch.arange(t, device=q.device))[:, None]
        residual = causal[None, None] if pad is None else causal[None, None] & pad[:, None, None, n : n + m]
        return history, residual

    def compress(self, pad_mask: torch.Tensor | None = None) -> None:
        """Quantize whole groups of the oldest residual tokens, keeping at least `residual` in full precision
        (`pad_mask` [B, >= length]: padded slots stay out of the key scales)."""
        p, n = self.policy, self.quantized
        move = Q.quantized_tokens(self.length, p.group, p.residual) - n
        if move <= 0:
            return
        valid = None if pad_mask is None else pad_mask[:, n : n + move].bool()
        keys = Q.quantize_keys(self.k[:, :, :move], p.kv_bits, p.group, valid)
        values = Q.quantize_values(self.v[:, :, :move], p.kv_bits, p.group)
        self._store(keys, values, move)
        self.k, self.v = self.k[:, :, move:].clone(), self.v[:, :, move:].clone()

    def _store(self, keys: Q.QuantizedKV, values: Q.QuantizedKV, move: int) -> None:
        g, n = self.policy.group, self.quantized
        new = {"k_codes": keys.codes, "k_scale": keys.scale, "k_zero": keys.zero}
        new |= {"v_codes": values.codes, "v_scale": values.scale, "v_zero": values.zero}
        grow = self.k_codes is None or n + move > self.k_codes.shape[2]
        tokens = -(-full_slots(n + move, first=self.k_codes is None) // g) * g  # whole groups
        for name, part in new.items():
            per_group = name in ("k_scale", "k_zero")  # key scales: one row per group of tokens
            start, stop, slots = (n // g, (n + move) // g, tokens // g) if per_group else (n, n + move, tokens)
            buffer = getattr(self, name)
            if grow:
                grown = part.new_empty(*part.shape[:2], slots, part.shape[3])
                if buffer is not None:
                    grown[:, :, :start] = buffer[:, :, :start]
                setattr(self, name, buffer := grown)
            buffer[:, :, start:stop] = part
        self.quantized = n + move

    def fill(self, batch, context, head_dim, dtype, device):
        self.k = torch.randn(batch, self.num_kv, context, head_dim, dtype=dtype, device=device)
        self.v = torch.randn_like(self.k)
        self.compress()

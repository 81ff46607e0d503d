"""What a profiler needs from a model's own attention, read in blocks of queries.

`AttentionStats` is an attention function registered through the transformers adapter: it
returns exact (sdpa) outputs, so every layer sees the model's normal activations, and records
per layer, one block of queries at a time (never a [T, T] matrix):

- `column_mass` [G, T]: attention mass every key received, summed over all queries and over the
  query heads of its KV group (what H2O accumulates to pick heavy hitters);
- `rows` [H, A, T]: the full probability rows of the chosen query positions (answer positions);
- `errors`: per quantized full policy (by label), [G] the relative error its codes add to those
  rows' outputs (quantization_error.py).

One sequence at a time (batch 1, no padding); causal attention over the whole sequence.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import duocal_runtime as dr
from duocal.measure.answer_loss import attention_function
from duocal.profiling.quantization_error import output_error

BLOCK_ELEMENTS = 1 << 22  # query rows x keys per block of probabilities (16 MiB in fp32)


@dataclass
class LayerStats:
    column_mass: torch.Tensor  # [G, T] fp32
    rows: torch.Tensor  # [H, A, T] fp32
    errors: dict[str, torch.Tensor] = field(default_factory=dict)  # policy label -> [G]


class AttentionStats:
    def __init__(self, rows: Sequence[int], quantized: Sequence[dr.Full] = (), scored: int | None = None):
        """`quantized`: full policies whose output error is measured on the first `scored` rows (default all)."""
        self.rows, self.quantized = list(rows), list(quantized)
        self.scored = len(self.rows) if scored is None else scored
        self.layers: dict[int, LayerStats] = {}

    def attention(self, module, q, k, v, attention_mask, scaling=None, dropout=0.0, **kwargs):
        """transformers attention signature: q [1, H, T, D], k/v [1, G, T, D] -> ([1, T, H, D], None)."""
        scale = scaling if scaling is not None else module.scaling
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
        stats = self.layers[module.layer_idx] = self.collect(q[0], k[0], scale)
        scored = self.rows[: self.scored]
        for policy in self.quantized:
            stats.errors[policy.label] = output_error(q[0][:, scored], k[0], v[0], scored, scale, policy)
        return out.transpose(1, 2), None

    def collect(self, q: torch.Tensor, k: torch.Tensor, scale: float) -> LayerStats:
        """q [H, T, D], k [G, T, D] -> column mass per KV head and the probability rows of `self.rows`."""
        heads, t = q.shape[0], q.shape[1]
        groups = k.shape[0]
        keys = k.float().repeat_interleave(heads // groups, dim=0)  # [H, T, D]
        column = torch.zeros(heads, t, dtype=torch.float32, device=q.device)
        picked = {}
        block = max(1, BLOCK_ELEMENTS // (heads * t))
        for i0 in range(0, t, block):
            i1 = min(t, i0 + block)  # causal: the block's queries see keys before i1 only
            logits = torch.matmul(q[:, i0:i1].float(), keys[:, :i1].transpose(-1, -2)).mul_(scale)  # [H, b, i1]
            future = torch.arange(i1, device=q.device)[None, :] > torch.arange(i0, i1, device=q.device)[:, None]
            probs = logits.masked_fill_(future, float("-inf")).softmax(-1)
            column[:, :i1] += probs.sum(1)
            for r in self.rows:
                if i0 <= r < i1:
                    picked[r] = F.pad(probs[:, r - i0], (0, t - i1))
        rows = torch.stack([picked[r] for r in self.rows], dim=1) if self.rows else column.new_zeros(heads, 0, t)
        return LayerStats(column.view(groups, heads // groups, t).sum(1), rows)


@contextlib.contextmanager
def recording(model, rows: Sequence[int], quantized: Sequence[dr.Full] = (), scored: int | None = None):
    """Inside the block, `model`'s forward passes record `AttentionStats` (yielded)."""
    stats = AttentionStats(rows, quantized, scored)
    with attention_function(model, stats.attention):
        yield stats

"""How much KIVI codes change a head's attention output: the profiler's `error:full-kv<bits>`.

For a scored query at position r, a decode step over a `full(kv_bits=b)` head reads the first
`quantized_tokens(r + 1)` keys and values as codes (runtime/quant/codes.py) and the rest in full
precision. The error is ||o' − o|| / ||o||, the mean over the KV head's query heads and the scored
rows, clipped to 1: o the exact attention output, o' the output over the quantized cache. An eviction
policy that keeps a share k of a row's mass moves the output by (1 − k) ||o_kept − o_dropped||, so
its relative error is 1 − k (the planner's loss for eviction) times a ratio of order one: the
mixed planner compares the two as losses of one kind.
"""

from __future__ import annotations

import torch

import duocal_runtime as dr
from duocal_runtime.quant import codes as Q


def quantized_prefix(x: torch.Tensor, quantized: int, policy: dr.Full, keys: bool) -> torch.Tensor:
    """x [G, T, D] with its first `quantized` tokens replaced by their dequantized codes."""
    if quantized == 0:
        return x
    part = x[None, :, :quantized].float()
    if keys:
        back = Q.dequantize_keys(
            Q.quantize_keys(part, policy.kv_bits, policy.group), policy.kv_bits, policy.group, x.dtype
        )
    else:
        values = Q.quantize_values(part, policy.kv_bits, policy.group)
        back = Q.dequantize_values(values, policy.kv_bits, policy.group, x.dtype)
    return torch.cat((back[0], x[:, quantized:]), dim=1)


def head_outputs(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """query [H, D] over keys / values [G, n, D] (H / G query heads per KV head) -> [H, D], in fp32."""
    grouped = query.float().view(keys.shape[0], -1, query.shape[-1])  # [G, R, D]: each KV head's query heads
    probs = torch.softmax(grouped @ keys.float().transpose(-1, -2) * scale, -1)  # no copy of keys per query head
    return (probs @ values.float()).view(query.shape)


def output_error(queries, k, v, rows: list[int], scale: float, policy: dr.Full) -> torch.Tensor:
    """queries [H, A, D] (the query heads at `rows`), k/v [G, T, D] -> [G]: the mean relative error."""
    groups = k.shape[0]
    errors, caches = [], {}
    for a, row in enumerate(rows):
        n = row + 1
        quantized = Q.quantized_tokens(n, policy.group, policy.residual)
        if quantized not in caches:
            caches[quantized] = (
                quantized_prefix(k, quantized, policy, True),
                quantized_prefix(v, quantized, policy, False),
            )
        quantized_k, quantized_v = caches[quantized]
        exact = head_outputs(queries[:, a], k[:, :n], v[:, :n], scale)
        approximate = head_outputs(queries[:, a], quantized_k[:, :n], quantized_v[:, :n], scale)
        relative = (approximate - exact).norm(dim=-1) / exact.norm(dim=-1).clamp_min(torch.finfo(torch.float32).tiny)
        errors.append(relative.clamp(max=1.0).view(groups, -1).mean(-1))
    return torch.stack(errors).mean(0) if errors else k.new_zeros(groups, dtype=torch.float32)

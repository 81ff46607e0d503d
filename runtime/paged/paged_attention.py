"""Attention of one layer over one continuous-batching pass: every request's tokens, every head group.

The engine packs a pass into one row: queries [1, H, T, D] of all requests back to back (no
padding: a token's position is its rank). Full heads attend to their paged history (pages.py;
quantized full heads: quantized_attention.py),
each request alone: one padded batch for decode passes, causal sdpa per request for prefills
(never a mask over the whole packed pass). Bounded heads run duocal's static groups on the slots
gathered from each request's block (ring of sink + recent, H2O budget), then write them back: a
decode pass is one batched `decode` per group, a prefill chunk is the group's `attend` per request.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch

from ..attention import dense as DA
from ..policies.base import DecodeStep, Step
from .quantized_attention import attend_quantized


@dataclass
class PagedStep:
    """What one forward pass of the engine holds, for every layer: the requests in packing order."""

    request_ids: list[str]
    past: list[int]  # tokens each request had before this pass
    new: list[int]  # tokens it adds in this pass
    bounded_blocks: torch.Tensor | None  # [B, chunks] long: each request's blocks of bounded slots
    page_rows: torch.Tensor | None = None  # every token's full-head page row, request by request (history, new)
    row_starts: torch.Tensor | None = None  # [B] long: where each request's rows start in page_rows

    @property
    def decode_only(self) -> bool:
        return all(n == 1 for n in self.new)

    @property
    def starts(self) -> list[int]:
        """Offset of each request's first new token in the packed batch (one per request)."""
        return list(itertools.accumulate(self.new[:-1], initial=0)) if self.new else []


@dataclass(frozen=True)
class PagedLayerPass:
    """Handed to the attention function under `LAYER_KWARG`: the layer, its step, its full-head history."""

    cache: Any  # the DuoPagedCache
    layer: int
    step: PagedStep
    full_k: torch.Tensor | None  # [N, F, D]: every request's full-head tokens in batch order (history + new)
    full_v: torch.Tensor | None
    history_read: bool  # False when the pass read nothing back (fresh prefills only): full_k is the new tokens

    @property
    def owner(self):
        return self.cache.owner

    def attend(self, query, key, value, pad_mask, scaling: float) -> torch.Tensor:
        """query [1, H, T, D], key/value [1, Hkv, T, D] of the new tokens -> [1, H, T, D]. No padding in a pass."""
        return attend_pass(self, query, key, value, scaling)


def head_index(kv_heads: list[int], rep: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(KV head indices, their query heads) of a group, as index tensors."""
    kv = torch.tensor(kv_heads, device=device)
    return kv, (kv[:, None] * rep + torch.arange(rep, device=device)).flatten()


def attend_pass(layer: PagedLayerPass, query, key, value, scaling: float) -> torch.Tensor:
    """query [1, H, T, D], key/value [1, Hkv, T, D] (new tokens) -> [1, H, T, D]."""
    cache, heads = layer.cache, layer.cache.layers[layer.layer]
    out = query.new_empty(query.shape)
    if heads.full:
        _, q_idx = head_index(heads.full, cache.rep, query.device)
        out[:, q_idx] = attend_full(layer, query[:, q_idx], scaling)
    for g, (policy, kv_heads) in enumerate(heads.quantized):
        kv_idx, q_idx = head_index(kv_heads, cache.rep, query.device)
        out[:, q_idx] = attend_quantized(
            layer, g, policy, kv_heads, query[:, q_idx], key[:, kv_idx], value[:, kv_idx], scaling
        )
    for g, (policy, kv_heads) in enumerate(heads.bounded):
        kv_idx, q_idx = head_index(kv_heads, cache.rep, query.device)
        out[:, q_idx] = attend_bounded(
            layer, g, policy, kv_heads, query[:, q_idx], key[:, kv_idx], value[:, kv_idx], scaling
        )
    return out


# --- full heads: paged history --------------------------------------------------------------
def history_spans(layer: PagedLayerPass) -> list[tuple[int, int]]:
    """[start, end) of each request's keys in `layer.full_k` (its whole history, or only its new tokens)."""
    spans, start = [], 0
    for past, new in zip(layer.step.past, layer.step.new, strict=True):
        length = past + new if layer.history_read else new
        spans.append((start, start + length))
        start += length
    return spans


def attend_full(layer: PagedLayerPass, q, scaling: float) -> torch.Tensor:
    """q [1, F*R, T, D] of the full heads -> [1, F*R, T, D]."""
    keys, values = layer.full_k.transpose(0, 1)[None], layer.full_v.transpose(0, 1)[None]  # [1, F, N, D]
    spans, step = history_spans(layer), layer.step
    if step.decode_only:
        return decode_full(q, keys, values, spans, scaling)
    out = torch.empty_like(q)
    for (k0, k1), t0, new in zip(spans, step.starts, step.new, strict=True):
        k, v = keys[:, :, k0:k1], values[:, :, k0:k1]
        seen = k1 - k0 - new  # keys before this request's first new token
        if seen == 0:
            out[:, :, t0 : t0 + new] = DA.sdpa(q[:, :, t0 : t0 + new], k, v, None, scaling, causal=True)
        else:
            causal = torch.arange(k1 - k0, device=q.device) <= seen + torch.arange(new, device=q.device)[:, None]
            out[:, :, t0 : t0 + new] = DA.sdpa(q[:, :, t0 : t0 + new], k, v, causal[None, None], scaling)
    return out


def decode_full(q, keys, values, spans, scaling: float) -> torch.Tensor:
    """One query per request: requests become a batch over their own keys, padded to the longest."""
    lengths = torch.tensor([k1 - k0 for k0, k1 in spans], device=q.device)
    starts = torch.tensor([k0 for k0, _ in spans], device=q.device)
    slot = torch.arange(int(lengths.max()), device=q.device)
    index = (starts[:, None] + slot).clamp(max=keys.shape[2] - 1)  # [B, S]
    k, v = (x[0].index_select(1, index.flatten()).unflatten(1, index.shape).transpose(0, 1) for x in (keys, values))
    mask = (slot < lengths[:, None])[:, None, None, :]  # [B, 1, 1, S]
    out = DA.decode_sdpa(q[0].transpose(0, 1)[:, :, None], k, v, mask, scaling)  # [B, F*R, 1, D]
    return out[:, :, 0].transpose(0, 1)[None]


# --- bounded heads: a block of slots per request ---------------------------------------------
def attend_bounded(layer: PagedLayerPass, g: int, policy, kv_heads, q, k, v, scaling: float) -> torch.Tensor:
    """q [1, G*R, T, D], k/v [1, G, T, D] of one bounded group -> [1, G*R, T, D]; slots read and written back."""
    cache, step = layer.cache, layer.step
    views = cache.cache_allocators["sliding_attention"].views[(layer.layer, g)]  # name -> (view, chunk)
    group = policy.make_group(kv_heads, cache.rep, max_length=1)
    if step.decode_only:
        blocks = {name: step.bounded_blocks[:, chunk] for name, (_, chunk) in views.items()}
        group.load_state({name: view.index_select(0, blocks[name]) for name, (view, _) in views.items()})
        rank = torch.tensor(step.past, device=q.device)
        decode = DecodeStep(rank.new_zeros(()), torch.ones_like(rank, dtype=torch.bool), rank, rank + 1, None, scaling)
        out = group.decode(
            q[0].transpose(0, 1)[:, :, None], k[0].transpose(0, 1)[:, :, None], v[0].transpose(0, 1)[:, :, None], decode
        )
        for name, value in group.state().items():
            views[name][0].index_copy_(0, blocks[name], value)
        return out[:, :, 0].transpose(0, 1)[None]
    out = torch.empty_like(q)
    for i, (t0, past, new) in enumerate(zip(step.starts, step.past, step.new, strict=True)):
        blocks = {name: step.bounded_blocks[i : i + 1, chunk] for name, (_, chunk) in views.items()}
        group.load_state({name: view.index_select(0, blocks[name]) for name, (view, _) in views.items()})
        ranks = past + torch.arange(new, device=q.device)[None]
        chunk = Step(past, torch.ones_like(ranks, dtype=torch.bool), ranks, ranks[:, -1] + 1, None, scaling)
        span = slice(t0, t0 + new)
        out[:, :, span] = group.attend(q[:, :, span], k[:, :, span], v[:, :, span], chunk)
        for name, value in group.state().items():
            views[name][0].index_copy_(0, blocks[name], value)
    return out

"""Attention of a layer's quantized full heads (`full(kv_bits=8|4)`) over one continuous-batching pass.

A request's codes sit in its full-head pages by the rows of their tokens, its full-precision
residual in a ring among its bounded slots (quantized_pages.py). A decode pass attends every request
at once: codes gathered from their rows and padded to the longest history (masked), the ring with
the new token written to its slot, as the static quantized group decodes; then each request whose
next group fell due codes it from the ring into its rows. A prefill chunk runs the dynamic quantized
group per request on its gathered history and residual in order (the same numbers as
`model.generate()`), then writes the codes it made to their rows and what stays in full
precision back to the ring. A prompt split across passes attends to the codes of its earlier
chunks, as duocal's chunked prefill (`prefill_chunk_size`) does.
"""

from __future__ import annotations

import torch

from ..policies.base import Step
from ..policies.full_quantized import QuantizedFullGroup
from ..quant import codes as Q
from ..quant.attention import quantized_attention
from .quantized_pages import PagedCodes, ring_key


class QuantizedPass:
    """One quantized group of one layer in one pass: its codes in the pages, its rings in the slots."""

    def __init__(self, layer, g: int, policy, kv_heads):
        cache, self.step, self.policy, self.kv_heads = layer.cache, layer.step, policy, kv_heads
        pages = cache.cache_allocators["full_attention"]
        self.codes = PagedCodes(pages.quantized_views[(layer.layer, g)], pages.tokens_per_page, policy.group)
        self.rings = cache.cache_allocators["sliding_attention"].views[(layer.layer, ring_key(g))]
        self.rep, self.size = cache.rep, policy.residual + policy.group

    def quantized(self, tokens: int) -> int:
        return Q.quantized_tokens(tokens, self.policy.group, self.policy.residual)

    def rows(self, requests: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Page rows of tokens at `positions` [B, N] of the requests [B] (indices into the pass)."""
        return self.step.page_rows[self.step.row_starts[requests, None] + positions]

    def ring_blocks(self, requests: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: self.step.bounded_blocks[requests, chunk] for name, (_, chunk) in self.rings.items()}

    def load_rings(self, blocks) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(self.rings[name][0].index_select(0, blocks[name]) for name in ("k", "v"))

    def store_rings(self, blocks, ring_k, ring_v) -> None:
        for name, ring in (("k", ring_k), ("v", ring_v)):
            self.rings[name][0].index_copy_(0, blocks[name], ring)

    # --- decode: every request at once ------------------------------------------------------
    def decode(self, q, k, v, scaling: float) -> torch.Tensor:
        """q [1, G*R, B, D], k/v [1, G, B, D]: one new token per request -> [1, G*R, B, D]."""
        p, device, past = self.policy, q.device, self.step.past
        requests = torch.arange(len(past), device=device)
        position = torch.tensor(past, device=device)
        quantized = torch.tensor([self.quantized(n) for n in past], device=device)
        blocks = self.ring_blocks(requests)
        ring_k, ring_v = self.load_rings(blocks)
        slot = position % self.size
        ring_k[requests, :, slot] = k[0].transpose(0, 1)
        ring_v[requests, :, slot] = v[0].transpose(0, 1)
        history, history_mask, longest = None, None, int(quantized.max())
        if longest:
            tokens = torch.arange(longest, device=device)
            history = self.codes.read(self.rows(requests, torch.minimum(tokens, position[:, None])))
            history_mask = (tokens < quantized[:, None])[:, None, None, :]
        held = position[:, None] - (position[:, None] - torch.arange(self.size, device=device)) % self.size
        masks = (history_mask, (held >= quantized[:, None])[:, None, None, :])
        query = q[0].transpose(0, 1)[:, :, None]  # [B, G*R, 1, D]
        out = quantized_attention(query, history, ring_k, ring_v, masks, scaling, p.kv_bits, p.group)
        self.code_due_groups(past, quantized, ring_k, ring_v)
        self.store_rings(blocks, ring_k, ring_v)
        return out[:, :, 0].transpose(0, 1)[None]

    def code_due_groups(self, past: list[int], quantized: torch.Tensor, ring_k, ring_v) -> None:
        """Code the group after each request's codes where this step's token made it due."""
        p = self.policy
        due = [i for i, n in enumerate(past) if self.quantized(n + 1) > self.quantized(n)]
        if not due:
            return
        requests = torch.tensor(due, device=quantized.device)
        positions = quantized[requests, None] + torch.arange(p.group, device=quantized.device)  # [due, group]
        slots = positions % self.size
        keys = ring_k[requests[:, None], :, slots].transpose(1, 2)  # [due, G, group, D]
        values = ring_v[requests[:, None], :, slots].transpose(1, 2)
        self.codes.write(
            self.rows(requests, positions),
            Q.quantize_keys(keys, p.kv_bits, p.group),
            Q.quantize_values(values, p.kv_bits, p.group),
        )

    # --- prefill: one request at a time -----------------------------------------------------
    def prefill(self, i: int, q, k, v, scaling: float) -> torch.Tensor:
        """Request i's chunk: q [1, G*R, T, D], k/v [1, G, T, D] -> [1, G*R, T, D]."""
        past, new, device = self.step.past[i], self.step.new[i], q.device
        request = torch.tensor([i], device=device)
        blocks = self.ring_blocks(request)
        ring_k, ring_v = self.load_rings(blocks)
        group = self.restored_group(request, past, ring_k, ring_v)
        before = group.quantized
        ranks = past + torch.arange(new, device=device)[None]
        out = group.attend(
            q, k, v, Step(past, torch.ones_like(ranks, dtype=torch.bool), ranks, ranks[:, -1] + 1, None, scaling)
        )
        if group.quantized > before:
            keys, values = group.history()
            g = self.policy.group
            self.codes.write(
                self.rows(request, torch.arange(before, group.quantized, device=device)[None]),
                Q.token_slice(keys, before, group.quantized, g, True),
                Q.token_slice(values, before, group.quantized, g, False),
            )
        slots = torch.arange(group.quantized, group.length, device=device) % self.size
        ring_k[:, :, slots], ring_v[:, :, slots] = group.k, group.v
        self.store_rings(blocks, ring_k, ring_v)
        return out

    def restored_group(self, request, past: int, ring_k, ring_v) -> QuantizedFullGroup:
        """The dynamic quantized group as `generate()` would hold it after `past` tokens of this request."""
        group = QuantizedFullGroup(self.policy, self.kv_heads, self.rep)
        group.quantized = self.quantized(past)
        if group.quantized:
            keys, values = self.codes.read(
                self.rows(request, torch.arange(group.quantized, device=ring_k.device)[None])
            )
            group.k_codes, group.k_scale, group.k_zero = keys.codes, keys.scale, keys.zero
            group.v_codes, group.v_scale, group.v_zero = values.codes, values.scale, values.zero
        held = torch.arange(group.quantized, past, device=ring_k.device) % self.size
        group.k, group.v = ring_k.index_select(2, held), ring_v.index_select(2, held)
        return group


def attend_quantized(layer, g: int, policy, kv_heads, q, k, v, scaling: float) -> torch.Tensor:
    """q [1, G*R, T, D], k/v [1, G, T, D] of one quantized full group over the packed pass -> [1, G*R, T, D]."""
    group = QuantizedPass(layer, g, policy, kv_heads)
    step = layer.step
    if step.decode_only:
        return group.decode(q, k, v, scaling)
    out = torch.empty_like(q)
    for i, (t0, new) in enumerate(zip(step.starts, step.new, strict=True)):
        span = slice(t0, t0 + new)
        out[:, :, span] = group.prefill(i, q[:, :, span], k[:, :, span], v[:, :, span], scaling)
    return out

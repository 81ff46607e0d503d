"""Heads ordered sparsest plan first, each tier chosen by the answer loss measured at the plan below it.

A profile deploys nested plans: the plan at 0.75 keeps full the heads of the plan at 0.875 and 12 more. A score per
head measured once (gates trained at g ~ 1, or the answer loss at g = 1) ranks each head alone; at a high
sparsity most heads stream, and a head that helps beside its full neighbours can move the answer the other way
beside streaming ones (on SmolLM2-135M, one head of layer 8 kept full with the heads around it streaming turned 7
of 8 right answers into 2). Here the order is built the way the plans are used: it starts from the heads `first`
(the sparsest plan's), then for each sparsity, densest last, it measures at the plan so far (those heads full,
the others streaming) the first-order gain of keeping each streaming head full (−∂L/∂g, `answer_loss.py`) and adds
the best until the plan at that sparsity is full; a last pass at the densest plan orders the rest. One backward
pass per prompt and tier. The profile's scores are then 1 − rank / heads, so `dr.plan` at each of these sparsities
keeps exactly the measured plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

import duocal_runtime as dr
from duocal.measure.answer_loss import plan_point, streaming_loss
from duocal_runtime.planning.head_order import bounded_head_count

NESTED_SPARSITIES = (0.9375, 0.875, 0.75, 0.625, 0.5)  # `duocal tune`'s default sparsities


@dataclass(frozen=True)
class NestedOrder:
    order: tuple[int, ...]  # flat head indices (layer × KV heads + head), the first kept full longest
    tiers: tuple[tuple[float, tuple[int, ...]], ...]  # (sparsity, the heads added for its plan), sparsest first

    def scores(self, shape: dr.ModelShape) -> list[list[float]]:
        """[L][G]: 1 − rank / heads (strictly decreasing along the order)."""
        count = len(self.order)
        flat = [0.0] * count
        for rank, head in enumerate(self.order):
            flat[head] = 1.0 - rank / count
        kv = shape.num_key_value_heads
        return [flat[layer * kv : (layer + 1) * kv] for layer in range(shape.num_hidden_layers)]

    def source(self, kv: int) -> dict:
        """What a profile's source records of the order: each tier's sparsity and heads as [layer, head]."""
        return {"nested": [{"sparsity": s, "added": [[h // kv, h % kv] for h in heads]} for s, heads in self.tiers]}


def full_counts(num_heads: int, sparsities: Sequence[float]) -> list[tuple[float, int]]:
    """(sparsity, heads full at it), sparsest first."""
    return [(s, num_heads - bounded_head_count(num_heads, s)) for s in sorted(set(sparsities), reverse=True)]


def sparsest_plan_heads(flat_scores: Sequence[float], sparsities: Sequence[float] = NESTED_SPARSITIES) -> list[int]:
    """The heads the sparsest of `sparsities` keeps full when it ranks by `flat_scores` (ties: the lower index)."""
    (_, count), *_ = full_counts(len(flat_scores), sparsities)
    return sorted(range(len(flat_scores)), key=lambda h: (-flat_scores[h], h))[:count]


def nested_order(
    model,
    pairs: Sequence[tuple[list[int], list[int]]],
    sink_window: dr.SinkWindow,
    first: Sequence[int],
    sparsities: Sequence[float] = NESTED_SPARSITIES,
    report: Callable[[int, int], None] = lambda done, total: None,
) -> NestedOrder:
    """The order from `first` through each of `sparsities` (module docstring), measured on `pairs` of (token ids,
    the rows that predict the answer); `report(done, total)` counts sequences over every pass."""
    shape = dr.shape_of_config(model.config)
    num_heads = shape.num_hidden_layers * shape.num_key_value_heads
    if len(set(first)) != len(first) or not all(0 <= h < num_heads for h in first):
        raise ValueError(f"the first heads must be distinct flat indices below {num_heads}, got {list(first)}")
    tiers, size = [], len(first)
    for sparsity, count in full_counts(num_heads, sparsities):  # each tier adds heads: none repeats a plan
        if count > size:
            tiers.append((sparsity, count))
            size = count
    total = (len(tiers) + 1) * len(pairs)
    order, added = list(first), []
    for done, (sparsity, size) in enumerate([*tiers, (None, num_heads)]):
        tick = lambda n, d=done: report(d * len(pairs) + n, total)  # noqa: E731
        gains = gains_at(model, pairs, sink_window, order, shape, tick)
        best = sorted((h for h in range(num_heads) if h not in order), key=lambda h: (-gains[h], h))
        new = best[: size - len(order)]
        order += new
        if sparsity is not None:
            added.append((sparsity, tuple(new)))
    return NestedOrder(tuple(order), tuple(added))


def gains_at(model, pairs, sink_window, full: Sequence[int], shape: dr.ModelShape, report) -> list[float]:
    """Per flat head: −∂L/∂g with the heads `full` kept full and the others streaming."""
    grid = torch.Size([shape.num_hidden_layers, shape.num_key_value_heads])
    at = plan_point(grid, set(range(grid.numel())) - set(full))
    return streaming_loss(model, pairs, sink_window, report, at).flatten().tolist()


def order_from_answer_loss(model, pairs, sink_window: dr.SinkWindow, report) -> NestedOrder:
    """The order whose first heads are the sparsest plan's by the answer loss at g = 1 (every head full; the
    profiler's `loss` score), then tier by tier; `report(done, total)` counts sequences over every pass."""
    total = (len(NESTED_SPARSITIES) + 1) * len(pairs)  # the g = 1 pass, a pass per later tier and the last one
    flat = streaming_loss(model, pairs, sink_window, lambda done: report(done, total)).flatten().tolist()
    first = sparsest_plan_heads(flat)
    return nested_order(model, pairs, sink_window, first, report=lambda done, _: report(len(pairs) + done, total))

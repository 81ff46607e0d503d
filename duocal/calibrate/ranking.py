"""Turning trained gates into profile scores, with ties resolved by measurement (beyond upstream).

Upstream clamps gates to [0, 1], so several heads can end exactly at 1.0 (on the demo model 3-4
gates ended >= 0.998 while only 2 KV heads carry retrieval). The runtime breaks ties by index,
which at high sparsity can stream a retrieval head and keep a useless one.

`method: gates` keeps upstream's scores (the clamped gates). `method: measured` re-orders the
top `max_candidates` heads by greedy forward selection on held-out calibration samples: starting
from every head streaming, it repeatedly keeps full the candidate whose addition gives the lowest
distillation loss (hard gates: 1 for kept heads, 0 for the rest). The candidates then receive
the candidates' gate values in that order (made strictly decreasing by 1e-4 steps), so scores stay
gate values and the runtime's sparsity rule picks the measured heads first.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from duocal.calibrate.engine import Distributed
from duocal.calibrate.model import build_objective, calibration_attention, check_recipe, load_frozen_model
from duocal.calibrate.nested_ranking import nested_ranking
from duocal.calibrate.plan_loss import PlanLoss
from duocal.calibrate.recipe import load_recipe


def tie_groups(gates: list[float], tie: float) -> list[list[int]]:
    """Flat head indices grouped by gates within `tie` of their neighbour (sorted descending)."""
    order = sorted(range(len(gates)), key=lambda i: -gates[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and gates[groups[-1][-1]] - gates[i] <= tie:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def candidates(gates: list[float], limit: int) -> list[int]:
    """The `limit` highest gates (descending, ties by index)."""
    return sorted(range(len(gates)), key=lambda i: (-gates[i], i))[:limit]


def assign_scores(gates: list[float], order: list[int], step: float = 1e-4) -> list[float]:
    """Give the heads in `order` (most important first) their sorted gate values, strictly decreasing."""
    values = sorted((gates[i] for i in order), reverse=True)
    scores = list(gates)
    ceiling = float("inf")
    for head, value in zip(order, values, strict=True):
        value = min(value, ceiling - step)
        scores[head] = max(0.0, value)
        ceiling = value
    return scores


def rank_heads(
    recipe, objective, raw: torch.Tensor, tokenizer, pad: int, where: Distributed = Distributed()
) -> tuple[list[list[float]], dict[str, Any]]:
    """(scores [layers][KV heads], description for the profile's source). Collective when distributed.

    `objective` is the `GateObjective` (under DeepSpeed: `engine.module`), `raw` the gates [L, G].
    """
    gates = raw.clamp(0, 1)
    flat = [float(g) for g in gates.flatten().tolist()]
    kv = gates.shape[1]
    info: dict[str, Any] = {
        "method": recipe.ranking.method,
        "tied_at_top": len(tie_groups(flat, recipe.ranking.tie)[0]),
    }
    if recipe.ranking.method == "gates":
        return gates.tolist(), info
    r = recipe.ranking
    pool = candidates(flat, min(r.max_candidates, len(flat)))
    measure = PlanLoss(recipe, objective, tokenizer, pad, where)
    chosen: list[int] = []
    losses: list[float] = []
    remaining = list(pool)
    while remaining:
        trials = [measure([*chosen, h], len(flat)) for h in remaining]
        best = min(range(len(remaining)), key=lambda i: (trials[i], i))
        chosen.append(remaining.pop(best))
        losses.append(trials[best])
    scores = assign_scores(flat, chosen)
    info.update(
        {
            "candidates": len(pool),
            "order": [[h // kv, h % kv] for h in chosen],
            "loss_when_kept_full": [round(loss, 6) for loss in losses],
            "samples": r.samples,
            "seed": r.seed,
        }
    )
    return [scores[i * kv : (i + 1) * kv] for i in range(gates.shape[0])], info


def rerank_profile(profile, recipe=None, overrides: list[str] = ()):
    """Re-rank any profile of a model (a calibrated one, an imported upstream pattern) by measurement.

    One process, no training: the scores play the part of the gates. Data, sink window and ranking
    settings come from `recipe` (default: the demo recipe) with `key=value` overrides; the model
    is the recipe's. The ties among the top heads are measured unless `ranking.method=gates`; with
    `ranking.nested=true` the order then goes sparsest plan first (nested_ranking.py). Returns a new `Profile`
    whose source records the measured order.
    """
    recipe = recipe if recipe is not None and not overrides else load_recipe(recipe, list(overrides))
    checked = check_recipe(recipe)
    profile.check_compatible(checked.config)
    model = load_frozen_model(recipe)
    with calibration_attention(model):
        objective = build_objective(model, recipe, init=1.0)
        raw = torch.tensor(profile.scores, dtype=torch.float32)
        scores, info = rank_heads(recipe, objective, raw, checked.tokenizer, checked.pad_id)
    if recipe.ranking.nested:
        scores, nested = nested_ranking(recipe, model, checked.tokenizer, scores)
        info = {**info, **nested}
    return replace(profile, scores=scores, source={**profile.source, "reranked": info})

"""Heads ordered sparsest plan first (duocal/measure/nested_order.py): each tier is the best gains measured at the
plan below it, the scores plan exactly those tiers, and the profiler's `--nested` writes them."""

import json

import pytest
import torch
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.cli.app import app
from duocal.measure import nested_order as N
from duocal.profiling import ProfilerConfig

from helpers.models import answer_pairs as pairs

SINK_WINDOW = dr.SinkWindow(4, 8)


def test_eight_heads_are_full_by_one_two_three_and_four_at_the_default_sparsities():
    assert N.full_counts(8, N.NESTED_SPARSITIES) == [(0.9375, 0), (0.875, 1), (0.75, 2), (0.625, 3), (0.5, 4)]


def test_a_head_that_helps_only_beside_another_full_one_joins_after_it(monkeypatch, four_layers):
    """Alone, head 6 gains most after head 1; but head 3 gains more than head 6 once head 1 is full (it reads what
    head 1 writes), so the nested order takes 1, then 3: what a score per head (1, 6, ...) would not."""
    alone = torch.tensor([0.1, 0.9, 0.2, 0.3, 0.05, 0.15, 0.6, 0.0])
    measured_at = []

    def fake(model, pairs_, sink_window, report, at=None):
        measured_at.append(frozenset(i for i, g in enumerate(at.flatten().tolist()) if g == 1.0))
        gains = alone.clone()
        if at.flatten()[1] == 1.0:
            gains[3] += 0.5
        return gains.view(4, 2)

    monkeypatch.setattr(N, "streaming_loss", fake)
    order = N.nested_order(four_layers, [], SINK_WINDOW, first=[1])
    assert order.order[:4] == (1, 3, 6, 2)
    assert order.tiers == ((0.75, (3,)), (0.625, (6,)), (0.5, (2,)))
    assert measured_at == [{1}, {1, 3}, {1, 3, 6}, {1, 3, 6, 2}]  # each tier at the plan below it, then the rest
    assert sorted(order.order) == list(range(8))


def test_the_scores_plan_each_tier_exactly(monkeypatch, four_layers):
    monkeypatch.setattr(N, "streaming_loss", lambda *a, at=None: torch.arange(8.0).view(4, 2))
    order = N.nested_order(four_layers, [], SINK_WINDOW, first=[0])
    profile = dr.Profile(dr.ModelInfo(dr.ModelShape(4, 4, 2, 16)), order.scores(dr.ModelShape(4, 4, 2, 16)))
    for sparsity, full in N.full_counts(8, N.NESTED_SPARSITIES):
        plan = dr.plan(profile, sparsity=sparsity)
        kept = {
            layer * 2 + head
            for layer, row in enumerate(plan.policies)
            for head, p in enumerate(row)
            if p.name == "full"
        }
        assert kept == set(order.order[:full]), sparsity


def test_the_first_heads_are_checked(four_layers):
    for first in ([1, 1], [8], [-1]):
        with pytest.raises(ValueError, match="distinct flat indices below 8"):
            N.nested_order(four_layers, [], SINK_WINDOW, first=first)


def test_measured_on_a_model_each_tier_adds_the_best_gains_at_its_plan(four_layers):
    """The real answer loss: the head a tier adds has the largest −∂L/∂g measured at the plan before it."""
    asked = pairs()
    order = N.order_from_answer_loss(four_layers, asked, SINK_WINDOW, lambda done, total: None)
    assert sorted(order.order) == list(range(8))
    for index, (sparsity, added) in enumerate(order.tiers):
        before = order.order[: order.order.index(added[0])]
        gains = N.gains_at(four_layers, asked, SINK_WINDOW, before, dr.shape_of_config(four_layers.config), print)
        streaming = [h for h in range(8) if h not in before]
        assert max(streaming, key=lambda h: (gains[h], -h)) == added[0], (index, sparsity)


def test_nested_needs_the_loss_score_alone():
    with pytest.raises(ValueError, match="--nested orders heads by the loss score at each plan"):
        ProfilerConfig(nested=True)  # passkey data: the retrieval score
    with pytest.raises(ValueError, match="--nested orders heads by the loss score at each plan"):
        ProfilerConfig(score="loss", nested=True, loss_at_sparsity=0.5)


def test_the_cli_writes_the_nested_order_and_its_tiers(tmp_path):
    """The demo model, passkey data scored by the answer's loss: each tier's plan keeps the heads added so far."""
    out = tmp_path / "nested.json"
    args = ["profile", "--score", "loss", "--nested", "--samples", "2", "--contexts", "256", "--kv-bits", "none"]
    result = CliRunner().invoke(app, [*args, "--output", str(out)])
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    flat = [s for row in written["scores"] for s in row]
    assert len(set(flat)) == len(flat)  # a strict order
    tiers = written["source"]["nested"]
    assert [t["sparsity"] for t in tiers] == sorted({t["sparsity"] for t in tiers}, reverse=True)
    profile = dr.load_profile(out)
    kept: set = set()
    for tier in tiers:
        kept |= {tuple(h) for h in tier["added"]}
        plan = dr.plan(profile, sparsity=tier["sparsity"])
        full = {
            (layer, head) for layer, row in enumerate(plan.policies) for head, p in enumerate(row) if p.name == "full"
        }
        assert full >= kept and len(full) == dict(N.full_counts(len(flat), [tier["sparsity"]]))[tier["sparsity"]]

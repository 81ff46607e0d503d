"""Tie-resolving head ranking: pure helpers, and the measured greedy order on a tiny model."""

from __future__ import annotations

import json

import pytest
from test_calibrate_run import QUICK, run_cli

from duocal.calibrate.ranking import assign_scores, candidates, tie_groups
from duocal_runtime.planning.head_order import bounded_order


def test_tie_groups_and_candidates():
    gates = [1.0, 0.2, 0.999, 1.0, 0.5, 0.995]
    assert tie_groups(gates, 0.002) == [[0, 3, 2], [5], [4], [1]]
    assert tie_groups(gates, 0.01) == [[0, 3, 2, 5], [4], [1]]
    assert candidates(gates, 3) == [0, 3, 2]


def test_assign_scores_reorders_candidates_only():
    gates = [1.0, 0.2, 1.0, 1.0, 0.5]
    scores = assign_scores(gates, order=[3, 0, 2])
    assert scores[1] == 0.2 and scores[4] == 0.5  # non-candidates keep their gate
    assert scores[3] > scores[0] > scores[2] >= 1.0 - 3e-4
    plan = bounded_order(scores)
    assert plan[-1] == 3 and plan[-2] == 0  # the runtime keeps 3 full first, then 0


def test_measured_ranking_orders_heads_by_measured_loss(tiny_llama_folder, tmp_path):
    out = tmp_path / "run"
    overrides = [o for o in QUICK if not o.startswith("ranking.")]
    result = run_cli(
        f"model.name_or_path={tiny_llama_folder}",
        *overrides,
        "train.steps=2",
        "ranking.method=measured",
        "ranking.samples=2",
        "checkpoint.every=0",
        "--output",
        str(out),
    )
    assert result.exit_code == 0, result.output
    profile = json.loads((out / "profile.json").read_text())
    info, gates = profile["source"]["ranking"], profile["source"]["gates"]
    kv = len(gates[0])
    order = [layer * kv + head for layer, head in info["order"]]
    assert len(order) == info["candidates"] == 4 and sorted(order) == [0, 1, 2, 3]
    losses = info["loss_when_kept_full"]
    assert losses[-1] == pytest.approx(0.0, abs=1e-9)  # every head full: the student is the teacher
    flat = [s for row in profile["scores"] for s in row]
    assert bounded_order(flat)[::-1] == order  # the profile's ranking is the measured one
    assert sorted(flat) == pytest.approx(sorted(g for row in gates for g in row), abs=1e-3)

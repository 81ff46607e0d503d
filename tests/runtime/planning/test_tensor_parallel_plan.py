"""Tensor parallel planning (duocal_runtime.planning.tensor_parallel): every rank holds the same number of full
KV heads per layer, chosen by the profile's scores; `unbalanced_layers` names the layers of a plan that is not."""

import itertools
import random

import pytest

import duocal_runtime as dr
from duocal_runtime.planning.tensor_parallel import (
    balanced_full_heads,
    balanced_plan,
    shards,
    unbalanced_layers,
    with_fewer_bounded,
)


def toy_profile(layers=6, kv_heads=4, seed=0):
    rng = random.Random(seed)
    rows = [[round(rng.random(), 3) for _ in range(kv_heads)] for _ in range(layers)]
    return dr.Profile(dr.ModelInfo(dr.ModelShape(layers, 2 * kv_heads, kv_heads, 16), "toy"), rows)


def is_full(plan):
    return [[p.name == "full" for p in row] for row in plan.policies]


def full_per_rank(plan, tp_size):
    return [[sum(row[h] for h in shard) for shard in shards(len(row), tp_size)] for row in is_full(plan)]


@pytest.mark.parametrize("tp_size,sparsity", [(2, 0.5), (2, 0.3), (4, 0.75), (2, 0.9)])
def test_every_rank_gets_the_same_number_of_full_heads_per_layer(tp_size, sparsity):
    profile = toy_profile()
    plain, balanced = dr.plan(profile, sparsity=sparsity), balanced_plan(profile, tp_size, sparsity)
    counts = full_per_rank(balanced, tp_size)
    assert all(len(set(row)) == 1 for row in counts)
    assert unbalanced_layers(is_full(balanced), tp_size) == []
    plain_full = sum(map(sum, is_full(plain)))
    assert plain_full <= sum(map(sum, counts)) < plain_full + tp_size
    bounded = {p for row in balanced.policies for p in row if p.name != "full"}
    assert bounded == {p for row in plain.policies for p in row if p.name != "full"}


def test_the_choice_is_the_best_by_score_among_balanced_choices():
    """Brute force over every balanced choice of the same size (3 units of 2 heads) on 3 layers x 4 heads."""
    scores, tp_size, units = toy_profile(layers=3, kv_heads=4, seed=3).scores, 2, 3
    chosen = balanced_full_heads(scores, tp_size, units * tp_size)
    best = 0.0
    for split in itertools.product(range(3), repeat=3):  # full heads per rank, per layer
        if sum(split) != units:
            continue
        options = [
            [a + b for a in itertools.combinations(range(2), n) for b in itertools.combinations(range(2, 4), n)]
            for n in split
        ]
        for picks in itertools.product(*options):
            best = max(best, sum(scores[layer][h] for layer, heads in enumerate(picks) for h in heads))
    assert sum(scores[layer][h] for layer, h in chosen) == pytest.approx(best)


def test_within_a_rank_the_highest_scoring_heads_stay_full():
    assert balanced_full_heads([[0.9, 0.1, 0.2, 0.8]], 2, 2) == {(0, 0), (0, 3)}
    assert balanced_full_heads([[0.9, 0.1, 0.2, 0.8]], 1, 2) == {(0, 0), (0, 3)}


def test_an_unbalanced_plan_is_named_by_its_layers():
    plan = dr.plan(toy_profile(), sparsity=0.5)
    counts = full_per_rank(plan, 2)
    uneven = [f"layer {layer} ({row[0]}/{row[1]})" for layer, row in enumerate(counts) if row[0] != row[1]]
    assert uneven and unbalanced_layers(is_full(plan), 2) == uneven
    with pytest.raises(dr.PlanError, match="tensor parallel size 3 does not divide the model's 4 KV heads"):
        unbalanced_layers(is_full(plan), 3)


@pytest.mark.parametrize("bounded", [12, 7, 0])
def test_fewer_bounded_heads_are_the_plan_at_that_count_in_the_profiles_order(bounded):
    """One rank: the plan's head set with its best-scored bounded heads full is `dr.plan` at that many bounded."""
    profile = toy_profile()
    fitted = with_fewer_bounded(dr.plan(profile, sparsity=0.75), profile, bounded)
    assert is_full(fitted) == is_full(dr.plan(profile, sparsity=bounded / 24))
    assert fitted.num_bounded == bounded


def test_fewer_bounded_heads_stay_balanced_and_keep_every_full_head():
    profile = toy_profile()
    planned = balanced_plan(profile, 2, 0.75)
    fitted = with_fewer_bounded(planned, profile, 14, tp_size=2)
    assert fitted.num_bounded == 14 and not unbalanced_layers(is_full(fitted), 2)
    kept = {(layer, h) for layer, row in enumerate(is_full(planned)) for h, full in enumerate(row) if full}
    assert kept <= {(layer, h) for layer, row in enumerate(is_full(fitted)) for h, full in enumerate(row) if full}


def test_fewer_bounded_heads_than_none_or_more_than_the_plan_has_are_refused():
    profile = toy_profile()
    planned = dr.plan(profile, sparsity=0.5)
    for bounded in (-1, 13):
        with pytest.raises(dr.PlanError, match="bounded heads of one policy"):
            with_fewer_bounded(planned, profile, bounded)
    with pytest.raises(dr.PlanError, match="cannot be balanced over 2 ranks"):
        with_fewer_bounded(balanced_plan(profile, 2, 0.75), profile, 13, tp_size=2)

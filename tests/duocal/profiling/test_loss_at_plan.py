"""The loss score at a target sparsity (loss_at_plan.py): the gates at the plan's hard values, the gradient
there exact, the rounds re-planning from each round's scores, and what the option refuses."""

import json

import pytest
import torch
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.cli.app import app
from duocal.measure.answer_loss import StreamingGates, answer_loss, attention_function, frozen, streaming_loss
from duocal.profiling import ProfilerConfig
from duocal.profiling import loss_at_plan as lap
from duocal_runtime.planning.head_order import bounded_heads_for_sparsity

from helpers.models import answer_pairs as pairs

SINK_WINDOW = dr.SinkWindow(4, 8)


def test_the_plan_point_is_the_plans_hard_values():
    assert lap.plan_point(torch.Size([2, 3]), {1, 3, 5}).tolist() == [[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]
    scores = torch.tensor([[0.3, -0.1], [0.9, 0.2]])
    assert lap.bounded_at(scores, 0.5) == bounded_heads_for_sparsity([0.3, -0.1, 0.9, 0.2], 0.5)
    assert lap.bounded_at(scores, 0.5) == {1, 3}  # the lowest scores, as dr.plan bounds them


def test_the_score_at_a_plan_point_is_its_first_order_loss_change(four_layers):
    """−∂L/∂g at the hard values: exact through the bounded heads' sink windows too (central differences)."""
    model = four_layers
    ids, rows = pairs((3,))[0]
    at = lap.plan_point(torch.Size([4, 2]), {0, 2, 5, 7})
    score = streaming_loss(model, [(ids, rows)], SINK_WINDOW, lambda done: None, at)
    for flat in range(8):
        mixer = StreamingGates(SINK_WINDOW, 4, 2, at=at)
        step, value = 1e-3, at.view(-1)[flat].item()
        with torch.no_grad(), frozen(model), attention_function(model, mixer.attention):
            mixer.gates.view(-1)[flat] = value - step
            lower = answer_loss(model, ids, rows)
            mixer.gates.view(-1)[flat] = value + step
            rise = (lower - answer_loss(model, ids, rows)) / (2 * step)
        assert score.view(-1)[flat].item() == pytest.approx(rise.item(), rel=5e-3, abs=5e-4)
    assert not torch.allclose(score, streaming_loss(model, [(ids, rows)], SINK_WINDOW, lambda done: None))


def test_gates_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match="gates must be 4 layers x 2 KV heads"):
        StreamingGates(SINK_WINDOW, 4, 2, at=torch.ones(2, 2))


def test_each_round_scores_at_the_plan_of_the_round_before(four_layers, monkeypatch):
    model = four_layers
    calls = []

    def spy(model_, pairs_, sink_window, report, at=None):
        calls.append(at)
        return streaming_loss(model_, pairs_, sink_window, report, at)

    monkeypatch.setattr(lap, "streaming_loss", spy)
    seen = []
    ranked = lap.loss_at_sparsity(model, pairs(), SINK_WINDOW, 0.75, lambda done, total: seen.append((done, total)))
    assert calls[0] is None and len(calls) == ranked.rounds + 1 and 1 <= ranked.rounds <= lap.ROUNDS
    first = streaming_loss(model, pairs(), SINK_WINDOW, lambda done: None)
    torch.testing.assert_close(calls[1], lap.plan_point(first.shape, set(lap.bounded_at(first, 0.75))))
    assert len(ranked.bounded) == 6 and torch.equal(calls[-1], lap.plan_point(first.shape, set(ranked.bounded)))
    torch.testing.assert_close(ranked.scores, streaming_loss(model, pairs(), SINK_WINDOW, lambda done: None, calls[-1]))
    assert ranked.settled == (lap.bounded_at(ranked.scores, 0.75) == ranked.bounded)
    assert seen[0] == (1, 2 * (lap.ROUNDS + 1)) and seen[-1][0] == 2 * (ranked.rounds + 1)


def fake_loss(gradient):
    """A streaming_loss whose −∂L/∂g at a point is `gradient(at)` (at: the gates, all 1 when None)."""
    return lambda model, pairs_, sink_window, report, at=None: gradient(torch.ones(2, 4) if at is None else at)


def test_a_loss_linear_in_the_gates_keeps_the_g1_ranking(monkeypatch):
    constant = torch.tensor([[0.5, 0.1, 0.7, 0.2], [0.3, 0.9, 0.0, 0.4]])
    monkeypatch.setattr(lap, "streaming_loss", fake_loss(lambda at: constant))
    ranked = lap.loss_at_sparsity(None, [], SINK_WINDOW, 0.75, lambda done, total: None)
    assert ranked.bounded == lap.bounded_at(constant, 0.75) and ranked.rounds == 1 and ranked.settled
    assert ranked.source == {"loss_at_sparsity": 0.75, "rounds": 1, "settled": True}


def test_a_head_that_matters_once_others_stream_is_kept_at_the_target_sparsity(monkeypatch):
    """Head 0 backs up head 5: while head 5 is full, streaming head 0 costs little, so the g = 1 ranking
    bounds it at 0.75; at that plan (head 5 bounded too) head 0 is worth keeping, and the ranking changes."""
    alone = torch.tensor([[0.1, 0.15, 0.5, 0.4], [0.3, 0.2, 0.6, 0.7]])

    def gradient(at):
        out = alone.clone()
        out.view(-1)[0] += 2.0 * (1 - at.view(-1)[5])
        return out

    monkeypatch.setattr(lap, "streaming_loss", fake_loss(gradient))
    ranked = lap.loss_at_sparsity(None, [], SINK_WINDOW, 0.75, lambda done, total: None)
    assert lap.bounded_at(alone, 0.75) == {0, 1, 2, 3, 4, 5}
    assert ranked.bounded == {1, 2, 3, 4, 5, 6} and ranked.rounds == 2 and ranked.settled


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(format="chat", haystack="repeated", loss_at_sparsity=0.0), "between 0 and 1"),
        (dict(format="chat", haystack="repeated", loss_at_sparsity=1.0), "between 0 and 1"),
        (dict(format="chat", haystack="repeated", loss_at_sparsity=float("nan")), "between 0 and 1"),
        (dict(loss_at_sparsity=0.5), "ranks heads by the loss score; the score here is retrieval"),
    ],
)
def test_the_target_sparsity_is_checked(settings, message):
    with pytest.raises(ValueError, match=message):
        ProfilerConfig(**settings)


def test_rounds_must_be_positive():
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        lap.loss_at_sparsity(None, [], SINK_WINDOW, 0.5, lambda done, total: None, rounds=0)


def test_the_cli_ranks_at_the_target_sparsity_and_records_it(tmp_path):
    """The demo model, passkey data scored by the answer's loss: the source says where it was ranked."""
    out = tmp_path / "at.json"
    args = ["profile", "--score", "loss", "--loss-at-sparsity", "0.625", "--samples", "2", "--contexts", "256"]
    result = CliRunner().invoke(app, [*args, "--kv-bits", "none", "--output", str(out)])
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    source = written["source"]
    assert written["deploy"]["sparsity"] == 0.625  # planned where it was ranked by default
    assert source["score"] == "loss" and source["loss_at_sparsity"] == 0.625
    assert 1 <= source["rounds"] <= lap.ROUNDS and isinstance(source["settled"], bool)
    assert "answer loss" in result.stderr

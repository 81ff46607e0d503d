"""The profiler's `loss` score (duocal/measure/answer_loss.py): gates at 1 are the full model, a gate at 0 is that head
on the runtime's sink window, and the score is the first-order rise of the answer's loss."""

import pytest
import torch

import duocal_runtime as dr
from duocal.measure.answer_loss import StreamingGates, answer_loss, attention_function, frozen, streaming_loss

from helpers.models import tiny_model

SINK_WINDOW = dr.SinkWindow(4, 8)
LENGTH = 40


@pytest.fixture(scope="module")
def model():
    return tiny_model(dtype=torch.float64)


def ids_and_rows(seed: int = 3):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, 97, (LENGTH,), generator=generator).tolist(), list(range(LENGTH - 6, LENGTH - 1))


def gated_logits(model, gates: torch.Tensor, ids: list[int]) -> torch.Tensor:
    shape = dr.shape_of_config(model.config)
    mixer = StreamingGates(SINK_WINDOW, shape.num_hidden_layers, shape.num_key_value_heads)
    with torch.no_grad(), attention_function(model, mixer.attention):
        mixer.gates.copy_(gates)
        return model(input_ids=torch.tensor([ids])).logits


def test_gates_at_one_are_the_full_model_and_a_gate_at_zero_is_the_runtimes_sink_window(model):
    ids, _ = ids_and_rows()
    shape = dr.shape_of_config(model.config)
    with torch.no_grad():
        full = model(input_ids=torch.tensor([ids])).logits
    torch.testing.assert_close(gated_logits(model, torch.ones(2, 2), ids), full)
    for streaming in ({1}, {0, 3}, {0, 1, 2, 3}):  # flat (layer, KV head) indices
        gates = torch.ones(2, 2)
        gates.view(-1)[list(streaming)] = 0.0
        plan = dr.plan_from_bounded_set(shape, streaming, SINK_WINDOW)
        with torch.no_grad(), dr.apply(model, plan):
            expected = model(input_ids=torch.tensor([ids])).logits
        torch.testing.assert_close(gated_logits(model, gates, ids), expected)
        assert not torch.allclose(expected, full)  # the sink window really drops keys at this length


def test_the_score_is_the_first_order_rise_of_the_answer_loss_when_one_head_streams(model):
    ids, rows = ids_and_rows()
    score = streaming_loss(model, [(ids, rows)], SINK_WINDOW, lambda done: None)
    shape = dr.shape_of_config(model.config)
    step = 1e-3
    for flat in range(4):
        mixer = StreamingGates(SINK_WINDOW, shape.num_hidden_layers, shape.num_key_value_heads)
        with torch.no_grad(), frozen(model), attention_function(model, mixer.attention):
            mixer.gates.view(-1)[flat] = 1.0 - step  # toward streaming
            lower = answer_loss(model, ids, rows)
            mixer.gates.view(-1)[flat] = 1.0 + step
            rise = (lower - answer_loss(model, ids, rows)) / (2 * step)  # central difference of L(1 - gate)
        assert score.view(-1)[flat].item() == pytest.approx(rise.item(), rel=5e-3, abs=5e-4)  # norms run in fp32
    assert score.abs().max() > 0
    assert all(p.requires_grad for p in model.parameters())  # frozen only while it measured


def test_the_mean_is_over_sequences_and_progress_counts_them(model):
    pairs = [ids_and_rows(seed) for seed in (3, 4)]
    seen = []
    both = streaming_loss(model, pairs, SINK_WINDOW, seen.append)
    each = [streaming_loss(model, [pair], SINK_WINDOW, lambda done: None) for pair in pairs]
    torch.testing.assert_close(both, (each[0] + each[1]) / 2)
    assert seen == [1, 2]

"""How much streaming one head would cost the answer: the answer loss (the profiler's `loss` score).

Every KV head gets a gate g (1: full attention, 0: its sink window), mixing the two outputs of its
query heads, g·o_full + (1 − g)·o_sink_window, as DuoAttention's gates do (Xiao et al., arXiv
2410.10819). At g = 1 the model is the full model; −∂L/∂g, with L the cross-entropy of the answer's
tokens, is the first-order rise of L when that head alone streams. One backward pass per sequence
gives it for every head at once. The sink window's output carries no gradient (its weight 1 − g is 0),
so the backward pass goes through full attention only.

The gates may also start at a plan's hard values (1: a full head, 0: a bounded one; `at`): then
−∂L/∂g of a bounded head is the first-order gain of keeping it full with the plan's other heads as
they are, and of a full head the cost of bounding it (loss_at_plan.py). Once a gate is below 1 the
sink window's output carries gradient too, so earlier heads' gates see the path through it.

Measured on chat prompts with their answers written out (data/chat_answers.py), this ranks the heads
that keep a chat answer right and well-formed: on SmolLM2-135M it is what made the quick-start profile
chat-safe at 0.5 (an attention-mass retrieval score lost 2-3 answers in 8 there).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch
import torch.nn.functional as F

import duocal_runtime as dr
from duocal_runtime import compat

MEASURE_ATTENTION = "duocal_measure"  # the attention function registered while a measurement runs


@contextlib.contextmanager
def attention_function(model, function):
    """Inside the block, `model`'s attention layers call `function` (transformers' attention signature)."""
    previous = compat.attention_implementation(model)
    compat.register(MEASURE_ATTENTION, function)
    compat.set_attention_implementation(model, MEASURE_ATTENTION)
    try:
        yield
    finally:
        compat.set_attention_implementation(model, previous)
        compat.unregister(MEASURE_ATTENTION)


class StreamingGates:
    """An attention function (transformers' signature) with a gate per (layer, KV head), at 1 or at `at`."""

    def __init__(self, sink_window: dr.SinkWindow, num_layers: int, num_kv_heads: int, device=None, at=None):
        self.sink_window = sink_window
        start = torch.ones(num_layers, num_kv_heads) if at is None else torch.as_tensor(at, dtype=torch.float32)
        if start.shape != (num_layers, num_kv_heads):
            raise ValueError(f"gates must be {num_layers} layers x {num_kv_heads} KV heads, got {tuple(start.shape)}")
        self.gates = start.to(device).clone().requires_grad_(True)
        self.sink_window_gradient = bool((start < 1).any())  # at 1 its weight is 0: no gradient through it

    def attention(self, module, q, k, v, attention_mask, scaling=None, dropout=0.0, **kwargs):
        """q [1, H, T, D], k/v [1, G, T, D] -> ([1, T, H, D], None)."""
        scale = scaling if scaling is not None else module.scaling
        full = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
        first = self.sink_window.sink + self.sink_window.recent  # queries before it see every key either way
        if q.shape[2] <= first:
            return full.transpose(1, 2), None
        with torch.set_grad_enabled(self.sink_window_gradient and torch.is_grad_enabled()):
            bounded = self.sink_window_output(q[:, :, first:], k, v, first, scale)
        gate = self.gates[module.layer_idx].repeat_interleave(q.shape[1] // k.shape[1])[None, :, None, None]
        mixed = gate * full[:, :, first:] + (1 - gate) * bounded
        return torch.cat((full[:, :, :first], mixed), dim=2).transpose(1, 2), None

    def sink_window_output(self, q, k, v, first: int, scale: float) -> torch.Tensor:
        """The sink window's output for the queries at `first` and after."""
        keys = torch.arange(k.shape[2], device=q.device)
        queries = torch.arange(first, first + q.shape[2], device=q.device)
        sees = self.sink_window.sees(queries[:, None], keys[None, :])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=sees, scale=scale, enable_gqa=True)


@contextlib.contextmanager
def frozen(model):
    """Inside the block no parameter of `model` asks for a gradient (the gates alone do)."""
    asked = [p for p in model.parameters() if p.requires_grad]
    for p in asked:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in asked:
            p.requires_grad_(True)


def answer_loss(model, ids: list[int], rows: list[int]) -> torch.Tensor:
    """Mean cross-entropy of the tokens after `rows` (each row predicts the next token)."""
    device = next(model.parameters()).device
    first = min(rows)
    logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False, logits_to_keep=len(ids) - first)
    picked = logits.logits[0][[r - first for r in rows]]
    picked = picked.to(torch.promote_types(picked.dtype, torch.float32))  # bf16 logits: a loss in fp32
    return F.cross_entropy(picked, torch.tensor([ids[r + 1] for r in rows], device=device))


def streaming_loss(
    model, sequences: Iterable[tuple[list[int], list[int]]], sink_window: dr.SinkWindow, report, at=None
) -> torch.Tensor:
    """[L, G]: the mean first-order rise of the answer loss when each head alone streams (−∂L/∂g), over
    `sequences` of (token ids, the rows that predict the answer), the gates at 1 or at `at` ([L, G]);
    `report(done)` after each."""
    shape = dr.shape_of_config(model.config)
    device = next(model.parameters()).device
    gates = StreamingGates(sink_window, shape.num_hidden_layers, shape.num_key_value_heads, device, at)
    total, count = torch.zeros_like(gates.gates), 0
    with frozen(model), attention_function(model, gates.attention), torch.enable_grad():
        for ids, rows in sequences:
            (gradient,) = torch.autograd.grad(answer_loss(model, ids, rows), gates.gates)
            total, count = total - gradient, count + 1
            report(count)
    return (total / max(count, 1)).detach().cpu()


def plan_point(shape: torch.Size, bounded: set[int]) -> torch.Tensor:
    """[L, G]: 1 for a full head, 0 for a bounded one (flat index: layer × KV heads + head)."""
    gates = torch.ones(shape)
    gates.view(-1)[sorted(bounded)] = 0.0
    return gates

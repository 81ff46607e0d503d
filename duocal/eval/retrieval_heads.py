"""Which KV heads retrieve: attention mass of the answer positions on the queried needle.

A retrieval head (DuoAttention, Xiao et al., ICLR 2025, arXiv 2410.10819; Wu et al.'s "retrieval
heads", arXiv 2404.15574) is one whose queries, while the model writes a passkey's value, look at
the needle that holds it. Measured here with the model's own (eager) attention probabilities, no
cache policy involved, so the result is a ground truth for calibration and evaluation to check
against: on the demo model the calibrated profile should rank these heads highest, and a plan
that keeps only them full should retrieve as well as full attention.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

import duocal_runtime as dr
from duocal.data import PasskeySample
from duocal_runtime import compat


@torch.no_grad()
def needle_attention(model, samples: Sequence[PasskeySample]) -> torch.Tensor:
    """Attention mass on the queried needle per (layer, KV head): ``[num_layers, num_kv_heads]``.

    For every answer of every sample, each position that predicts an answer token contributes the
    attention probability it puts on the needle's tokens (template, key and value); that is
    averaged over the answer's positions, summed over the query heads of each KV head's group (so a
    value lies in ``[0, num_attention_heads // num_key_value_heads]``), then averaged over answers.
    Runs the model once per sample with eager attention; the model's attention implementation is
    restored afterwards. Call it on a model without a duocal plan applied.
    """
    if not samples:
        raise ValueError("needle_attention needs at least one sample")
    shape = dr.shape_of_config(model.config)
    group = shape.num_attention_heads // shape.num_key_value_heads
    device = next(model.parameters()).device
    previous = compat.attention_implementation(model)
    compat.set_attention_implementation(model, "eager")
    try:
        total = torch.zeros(shape.num_hidden_layers, shape.num_key_value_heads, dtype=torch.float64)
        answers = 0
        for sample in samples:
            out = model(input_ids=torch.tensor([sample.input_ids], device=device), output_attentions=True)
            for answer in sample.answers:
                needle = sample.needles[answer.needle]
                rows = list(answer.predict_positions)
                for layer, probs in enumerate(out.attentions):  # probs: [1, H, T, T]
                    total[layer] += needle_mass(probs[0], rows, needle.start, needle.end, group).double().cpu()
                answers += 1
    finally:
        compat.set_attention_implementation(model, previous)
    return (total / answers).float()


def needle_mass(probs: torch.Tensor, rows: list[int], start: int, end: int, group: int) -> torch.Tensor:
    """probs [H, T, T] -> [H // group]: mass of `rows` on keys [start, end), mean over rows, sum per group."""
    mass = probs[:, rows, start:end].sum(-1).mean(-1)  # [H]
    return mass.view(-1, group).sum(-1)


def top_heads(mass: torch.Tensor | Sequence[Sequence[float]], share: float = 0.25) -> list[tuple[int, int]]:
    """(layer, KV head) pairs with at least ``share`` of the largest mass, strongest first.

    On the demo model the retrieving heads stand far apart from the rest (about 1.0 and 0.7 of
    mass against at most 0.07 for every other head), so the cut is not delicate.
    """
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share must be in (0, 1], got {share!r}")
    mass = torch.as_tensor(mass, dtype=torch.float32)  # [L, Hkv]
    cut = share * mass.max().item()
    heads = [(mass[layer, head].item(), layer, head) for layer, head in (mass >= cut).nonzero().tolist()]
    return [(layer, head) for _, layer, head in sorted(heads, key=lambda h: (-h[0], h[1], h[2]))]


def flat_indices(heads: Sequence[tuple[int, int]], num_kv_heads: int) -> set[int]:
    """(layer, KV head) pairs -> flat indices ``layer * num_kv_heads + head`` (as plans use)."""
    return {layer * num_kv_heads + head for layer, head in heads}


def find_retrieval_heads(model, samples: Sequence[PasskeySample], share: float = 0.25) -> list[tuple[int, int]]:
    """`top_heads(needle_attention(model, samples), share)`."""
    return top_heads(needle_attention(model, samples), share)

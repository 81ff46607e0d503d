"""Model shapes the benchmark builds with random weights, by name."""

from __future__ import annotations

import random

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import duocal_runtime as dr

SHAPES = {
    # the CPU default: Llama proportions, small enough for 32k contexts on 2 cores
    "cpu-small": dict(
        num_hidden_layers=8,
        hidden_size=1024,
        num_attention_heads=16,
        num_key_value_heads=4,
        intermediate_size=2816,
        vocab_size=32000,
    ),
    # Llama-3-8B: what users serve on one GPU
    "llama3-8b": dict(
        num_hidden_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=14336,
        vocab_size=128256,
        rope_theta=500000.0,
    ),
    # seconds on any machine: for tests of the benchmark itself
    "tiny": dict(
        num_hidden_layers=2,
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
        vocab_size=1000,
    ),
}


def bench_model(shape: str, device: str, dtype: torch.dtype, max_positions: int) -> LlamaForCausalLM:
    """A random-weight Llama of the named shape, built directly on `device` in `dtype` (seed 0)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    config = LlamaConfig(**SHAPES[shape], max_position_embeddings=max_positions)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def weight_bytes_read(model) -> int:
    """Bytes of weights a decode step reads: every parameter once, except an untied input
    embedding table (one row of it is read)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    return total if embed.data_ptr() == head.data_ptr() else total - embed.numel() * embed.element_size()


def random_scores_profile(config, seed: int = 0) -> dr.Profile:
    """A profile of seeded random scores for a random-weight model: any head choice is as good there, and random
    scores put heads of different policies in one layer, as real profiles do (the layout a plan runs)."""
    shape, rng = dr.shape_of_config(config), random.Random(seed)
    scores = [[rng.random() for _ in range(shape.num_key_value_heads)] for _ in range(shape.num_hidden_layers)]
    info = dr.ModelInfo(shape, f"random weights ({config.model_type})", None, "LlamaForCausalLM")
    return dr.Profile(info, scores, {"kind": "random scores", "seed": seed})

"""Small builders shared by tests."""

from __future__ import annotations

import random

import duocal_runtime as dr


def random_profile(layers=4, kv_heads=2, heads=4, head_dim=8, seed=0, ties=False) -> dr.Profile:
    rng = random.Random(seed)
    pick = (lambda: rng.choice([0.0, 0.5, 1.0])) if ties else rng.random
    scores = [[pick() for _ in range(kv_heads)] for _ in range(layers)]
    shape = dr.ModelShape(layers, heads, kv_heads, head_dim)
    return dr.Profile(dr.ModelInfo(shape, "test/model", None, "LlamaForCausalLM"), scores, {"kind": "test"})

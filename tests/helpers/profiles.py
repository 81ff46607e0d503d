"""Profiles and upstream pattern folders built for tests."""

from __future__ import annotations

import json
import random

import numpy as np

import duocal_runtime as dr


def random_profile(layers=4, kv_heads=2, heads=4, head_dim=8, seed=0, ties=False) -> dr.Profile:
    rng = random.Random(seed)
    pick = (lambda: rng.choice([0.0, 0.5, 1.0])) if ties else rng.random
    scores = [[pick() for _ in range(kv_heads)] for _ in range(layers)]
    shape = dr.ModelShape(layers, heads, kv_heads, head_dim)
    return dr.Profile(dr.ModelInfo(shape, "test/model", None, "LlamaForCausalLM"), scores, {"kind": "test"})


def write_pattern(folder, gates, model_name="models/Mistral-7B-Instruct-v0.2"):
    """An upstream DuoAttention pattern folder: `full_attention_heads.tsv` of `gates` and its `config.json`."""
    folder.mkdir(parents=True, exist_ok=True)
    np.savetxt(folder / "full_attention_heads.tsv", np.array(gates), delimiter="\t")  # upstream: %.18e, tabs
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_name": model_name,
                "sink_size": 128,
                "recent_size": 256,
                "lr": 0.02,
                "reg_weight": 0.05,
                "exp_name": "x",
            }
        )
    )
    return folder

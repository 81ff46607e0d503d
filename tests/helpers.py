"""Small builders shared by tests."""

from __future__ import annotations

import random
import time

import duocal_runtime as dr


def random_profile(layers=4, kv_heads=2, heads=4, head_dim=8, seed=0, ties=False) -> dr.Profile:
    rng = random.Random(seed)
    pick = (lambda: rng.choice([0.0, 0.5, 1.0])) if ties else rng.random
    scores = [[pick() for _ in range(kv_heads)] for _ in range(layers)]
    shape = dr.ModelShape(layers, heads, kv_heads, head_dim)
    return dr.Profile(dr.ModelInfo(shape, "test/model", None, "LlamaForCausalLM"), scores, {"kind": "test"})


def pool_is_whole(served, seconds=20) -> bool:
    """Every page of a served model's pool is free again (polled for `seconds`)."""
    cache, deadline = served.manager.cache, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        if cache.free_sectors() == cache.num_sectors:
            return True
        time.sleep(0.05)
    return False

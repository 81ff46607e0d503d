"""How many requests a serving pool holds: duocal's paged cache against plain attention, computed
with the very cache the server uses (built on the meta device: no memory is allocated).

    python -m benchmarks.runtime.pool_requests --shape llama3-8b --memory 80GB --weights 16.1GB \
        --contexts 32768,131072 --sparsity 0,0.5,0.75 [--kv-bits 16,8,4]

The KV pool is `--memory` minus `--weights` (activations and the engine's buffers are left out, so
real servers hold a little less of both). Bounded heads are sink 64 + recent 256, upstream
DuoAttention's deployment sink window; which heads are bounded does not change the count (a page holds
the full heads of every layer), only how many.
"""

from __future__ import annotations

import argparse
import random

import torch
from transformers import LlamaConfig

import duocal_runtime as dr
from benchmarks.runtime.serving import PAGE
from benchmarks.runtime.shapes import SHAPES
from duocal_runtime.paged.paged_cache import DuoPagedCache, pool_summary
from duocal_runtime.paged.pool_size import pool_blocks, pool_config
from duocal_runtime.paged.quantized_pages import page_size_for
from duocal_runtime.planning.budget import Budget
from duocal_runtime.planning.sizes import GiB


def synthetic_profile(shape: dr.ModelShape) -> dr.Profile:
    rng = random.Random(0)
    rows = [[rng.random() for _ in range(shape.num_key_value_heads)] for _ in range(shape.num_hidden_layers)]
    return dr.Profile(dr.ModelInfo(shape, "synthetic"), rows)


def held(config, plan: dr.Plan, kv_bytes: int, context: int, dtype: torch.dtype) -> dict:
    rep = plan.shape.num_attention_heads // plan.shape.num_key_value_heads
    page = page_size_for(plan, PAGE)  # quantized full heads: pages of whole code groups
    cb = pool_config(page, pool_blocks(kv_bytes, plan.shape, dtype, page))
    cache = DuoPagedCache(plan, config, cb, torch.device("meta"), dtype, rep)
    return pool_summary(cache, context, page)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--memory", default="80GB", help="device memory")
    ap.add_argument("--weights", default="16.1GB", help="memory the weights take (Llama-3-8B in bf16: 16.1 GB)")
    ap.add_argument("--contexts", default="32768,131072")
    ap.add_argument("--sparsity", default="0,0.5,0.75")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kv-bits", default="16", help="bits full heads store, one row each: 16,8,4")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    config = LlamaConfig(**SHAPES[args.shape], max_position_embeddings=max(map(int, args.contexts.split(","))))
    shape = dr.shape_of_config(config)
    kv_bytes = Budget.parse(args.memory).amount - Budget.parse(args.weights).amount
    profile = synthetic_profile(shape)
    print(f"{args.shape}, {args.dtype}, KV pool {kv_bytes / 1e9:.1f} GB")
    print("context | bounded heads | KV bits | requests held | plain attention | x | KV per request")
    for context in map(int, args.contexts.split(",")):
        for sparsity in map(float, args.sparsity.split(",")):
            for bits in map(int, args.kv_bits.split(",")):
                plan = dr.plan(profile, sparsity=sparsity, sink=64, recent=256, kv_bits=bits)
                s = held(config, plan, kv_bytes, context, dtype)
                ratio = s["requests"] / s["plain_requests"] if s["plain_requests"] else float("inf")
                print(
                    f"{context} | {sparsity:.0%} | {bits} | {s['requests']} | {s['plain_requests']} | {ratio:.2f} | "
                    f"{s['bytes_per_request'] / GiB:.2f} GiB"
                )


if __name__ == "__main__":
    main()

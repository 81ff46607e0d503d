"""Benchmark: decode speed, prefill time, KV bytes and peak RSS, duocal vs transformers' DynamicCache.

    OMP_NUM_THREADS=1 python -m duocal_runtime.bench [--contexts 2048,8192,32768] [--out bench.json]

Model: random weights, Llama-shaped (8 layers, hidden 1024, 16 query / 4 KV heads, head_dim 64,
MLP 2816), fp32 on CPU, batch 1. Rows, in one run: `dynamic` (transformers DynamicCache, sdpa),
`full` (duocal all-full plan), `stream50` / `stream75` (50% / 75% of KV heads sink_window 64+256),
`h2o50` (H2O on every head, heavy = recent, at the KV bytes of `stream50`).

Each row runs in a fresh process so peak RSS is its own. Decode is timed after filling the
cache with random keys and values of the right shapes instead of a real prefill (decode cost
does not depend on the values; a 32k prefill of this model takes minutes here); prefill is a
real forward pass and is skipped above `--max-prefill` tokens. Ratios are against `dynamic`.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

import duocal_runtime as dr
from duocal_runtime.head_groups import FullGroup, H2OGroup, SinkWindowGroup

ROWS = ("dynamic", "full", "stream50", "stream75", "h2o50")
SINK, RECENT = 64, 256


def bench_model() -> LlamaForCausalLM:
    config = LlamaConfig(num_hidden_layers=8, hidden_size=1024, num_attention_heads=16, num_key_value_heads=4,
                         intermediate_size=2816, vocab_size=32000, max_position_embeddings=65536)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def row_plan(row: str, shape: dr.ModelShape, context: int) -> dr.Plan | None:
    order = list(range(shape.num_kv_heads_total))  # random weights: any head choice is as good
    window = dr.SinkWindow(SINK, RECENT)
    if row == "full":
        return dr.uniform_plan(shape, dr.Full())
    if row in ("stream50", "stream75"):
        count = shape.num_kv_heads_total * (50 if row == "stream50" else 75) // 100
        return dr.plan_from_streaming_set(shape, set(order[:count]), window)
    if row == "h2o50":
        budget = (context + window.budget) // 2  # per head: the mean of full and streaming
        return dr.uniform_plan(shape, dr.H2O(heavy=budget - budget // 2, recent=budget // 2))
    return None


def fill_dynamic(cache: DynamicCache, model, context: int) -> None:
    shape = dr.shape_of_config(model.config)
    for layer in range(shape.num_hidden_layers):
        k = torch.randn(1, shape.num_key_value_heads, context, shape.head_dim)
        cache.update(k, torch.randn_like(k), layer)


def fill_duo(cache: dr.DuoCache, context: int) -> None:
    """Give every group the state a `context`-token prompt leaves (random keys and values)."""
    for layer in cache.layers:
        for group in layer.groups:
            kept = min(context, group.policy.budget or context)
            shape = (1, group.num_kv, kept, 64)
            group.k, group.v = torch.randn(shape), torch.randn(shape)
            if isinstance(group, FullGroup):
                group.length = kept
            elif isinstance(group, SinkWindowGroup):
                ranks = list(range(SINK)) + list(range(context - RECENT, context))
                group.rank = torch.tensor([ranks[:kept]])
            elif isinstance(group, H2OGroup):
                group.rank = torch.arange(context - kept, context).expand(1, group.num_kv, kept).clone()
                group.score = torch.rand(1, group.num_kv, kept)
        layer.seen, layer.real = context, torch.tensor([context])
        layer.is_initialized = True


def time_decode(model, cache, context: int, steps: int) -> float:
    token = torch.tensor([[1]])
    with torch.inference_mode():
        model(input_ids=token, position_ids=torch.tensor([[context]]), cache=cache)  # warm-up step
        start = time.perf_counter()
        for i in range(steps):
            model(input_ids=token, position_ids=torch.tensor([[context + 1 + i]]), cache=cache)
    return steps / (time.perf_counter() - start)


def time_prefill(model, cache, context: int) -> float:
    ids = torch.randint(0, 32000, (1, context), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        start = time.perf_counter()
        model(input_ids=ids, cache=cache, logits_to_keep=1)
    return time.perf_counter() - start


def kv_bytes(cache) -> int:
    if isinstance(cache, dr.DuoCache):
        return cache.kv_bytes()
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)


def run_row(row: str, context: int, steps: int, max_prefill: int) -> dict:
    torch.set_num_threads(1)
    model = bench_model()
    shape = dr.shape_of_config(model.config)
    plan = row_plan(row, shape, context)
    runtime = dr.apply(model, plan) if plan is not None else None
    new_cache = runtime.new_cache if runtime else (lambda: DynamicCache(config=model.config))
    result = {"row": row, "context": context}
    if context <= max_prefill:
        cache = new_cache()
        result["prefill_s"] = time_prefill(model, cache, context)
        del cache
    cache = new_cache()
    fill_duo(cache, context) if runtime else fill_dynamic(cache, model, context)
    result["decode_tok_s"] = time_decode(model, cache, context, steps)
    result["kv_bytes"] = kv_bytes(cache)
    full_plan = dr.uniform_plan(shape, dr.Full())
    seen = context + steps + 1
    result["kv_bytes_min"] = (plan or full_plan).kv_bytes(seen, batch=1, dtype="float32")
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def add_ratios(results: list[dict]) -> None:
    base = {r["context"]: r for r in results if r["row"] == "dynamic"}
    for r in results:
        b = base.get(r["context"])
        r["kv_vs_min"] = r["kv_bytes"] / r["kv_bytes_min"]
        if b:
            r["decode_speedup"] = r["decode_tok_s"] / b["decode_tok_s"]
            r["kv_vs_dynamic"] = r["kv_bytes"] / b["kv_bytes"]
            if "prefill_s" in r and "prefill_s" in b:
                r["prefill_speedup"] = b["prefill_s"] / r["prefill_s"]


def print_table(results: list[dict]) -> None:
    cols = ["row", "context", "decode_tok_s", "decode_speedup", "prefill_s", "prefill_speedup",
            "kv_bytes", "kv_vs_dynamic", "kv_vs_min", "peak_rss_mb"]
    print(" | ".join(cols))
    for r in results:
        cells = [r.get(c, "-") for c in cols]
        print(" | ".join(f"{c:.3g}" if isinstance(c, float) else str(c) for c in cells))
    print("decode: cache filled with random K/V (no real prefill); prefill: one real forward pass.")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="2048,8192,32768")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--steps", type=int, default=16, help="decode steps timed per row")
    parser.add_argument("--max-prefill", type=int, default=8192, help="skip real prefill above this length")
    parser.add_argument("--out", default="bench-runtime.json")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: ROW:CONTEXT in this process
    args = parser.parse_args(argv)
    if args.one:
        row, context = args.one.split(":")
        print(json.dumps(run_row(row, int(context), args.steps, args.max_prefill)))
        return
    results = []
    for context in map(int, args.contexts.split(",")):
        for row in args.rows.split(","):
            cmd = [sys.executable, "-m", "duocal_runtime.bench", "--one", f"{row}:{context}",
                   "--steps", str(args.steps), "--max-prefill", str(args.max_prefill)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"done {row} @ {context}", file=sys.stderr)
    add_ratios(results)
    print_table(results)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()

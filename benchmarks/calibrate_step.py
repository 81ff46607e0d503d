"""Benchmark: cost of one calibration step against a plain forward+backward of the same model.

    OMP_NUM_THREADS=1 python -m benchmarks.calibrate_step [--model demo] [--contexts 1024,4096] [--json out.json]

Same model, same tokens (one passkey sample per context, batch 1), medians of `--repeat` runs
after a warm-up, one torch thread. Rows:

- `plain fwd+bwd (LM)`: the causal LM with trainable weights, cross-entropy on every token,
  `loss.backward()`: the step of ordinary training (the baseline of the ratios);
- `plain fwd+bwd (decoder)`: the same without the LM head (what calibration runs);
- `calibration fwd+bwd`: `GateObjective`: teacher pass (no grad) + gated student pass with
  blocked streaming attention + loss, backward to the gates;
- `calibration step`: the same through a one-process DeepSpeed engine, optimiser step included.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from duocal.calibrate import engine as ds
from duocal.calibrate.batches import StepData
from duocal.calibrate.model import build_objective, calibration_attention, check_recipe, load_frozen_model
from duocal.calibrate.recipe import load_recipe
from duocal_runtime.files.atomic import write_atomic
from duocal_runtime.files.output_paths import check_output


def median_seconds(fn, repeat: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        tic = time.perf_counter()
        fn()
        times.append(time.perf_counter() - tic)
    return statistics.median(times)


def bench(model_name: str, contexts: list[int], repeat: int, sink: int, recent: int, block: int) -> list[dict]:
    rows = []
    for context in contexts:
        recipe = load_recipe(
            None,
            [
                f"model.name_or_path={model_name}",
                f"data.context={context}",
                f"attention.sink={sink}",
                f"attention.recent={recent}",
                f"attention.block={block}",
            ],
        )
        checked = check_recipe(recipe)
        data = StepData(checked.generator, checked.pad_id, 1, 1)
        micro = data.micro_batches(0, 0)[0]
        model = load_frozen_model(recipe)
        ids = micro.input_ids

        for p in model.parameters():
            p.requires_grad_(True)

        times = {
            "plain fwd+bwd (LM)": median_seconds(functools.partial(plain_lm_step, model, ids), repeat),
            "plain fwd+bwd (decoder)": median_seconds(functools.partial(plain_decoder_step, model, ids), repeat),
        }
        with calibration_attention(model):
            times.update(calibration_times(recipe, model, micro, repeat))
        base = times["plain fwd+bwd (LM)"]
        for name, seconds in times.items():
            rows.append(
                {
                    "context": context,
                    "tokens": int(ids.numel()),
                    "what": name,
                    "seconds": round(seconds, 5),
                    "ratio": round(seconds / base, 3),
                }
            )
    return rows


def plain_lm_step(model, ids: torch.Tensor) -> None:
    """One forward+backward of the language-model loss, without calibration's gates."""
    model.zero_grad(set_to_none=True)
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()


def plain_decoder_step(model, ids: torch.Tensor) -> None:
    """One forward+backward through the decoder alone (no LM head), without calibration's gates."""
    model.zero_grad(set_to_none=True)
    model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state.pow(2).mean().backward()


def calibration_times(recipe, model, micro, repeat: int) -> dict[str, float]:
    """The gated objective's forward+backward alone, and as a one-process DeepSpeed step."""
    objective = build_objective(model, recipe, init=1.0)
    gates, times = objective.gates, {}

    def calibration():
        gates.zero_grad(set_to_none=True)
        objective(micro.input_ids, micro.position_ids, micro.positions, micro.scale)[0].backward()

    times["calibration fwd+bwd"] = median_seconds(calibration, repeat)
    with ds.process_group():
        cfg = ds.deepspeed_config(recipe.deepspeed, 1, 1, 1, "float32", gates.weight.numel())
        engine = ds.initialize(objective, cfg, 0.02, (0.9, 0.999))

        def step():
            loss = engine(micro.input_ids, micro.position_ids, micro.positions, micro.scale)[0]
            engine.backward(loss)
            engine.step()

        times["calibration step"] = median_seconds(step, repeat)
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.calibrate_step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", default="demo")
    parser.add_argument("--contexts", default="1024,4096")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--sink", type=int, default=16)
    parser.add_argument("--recent", type=int, default=64)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = parser.parse_args(argv)
    if args.json:
        check_output(args.json, "--json")  # before the benchmark
    torch.set_num_threads(args.threads)
    rows = bench(
        args.model, [int(c) for c in args.contexts.split(",")], args.repeat, args.sink, args.recent, args.block
    )
    table = Table(title=f"calibration step vs plain forward+backward ({args.model}, {args.threads} thread)")
    for column in ("context", "tokens", "what", "ms", "x plain (LM)"):
        table.add_column(column, justify="left" if column == "what" else "right")
    for r in rows:
        table.add_row(str(r["context"]), str(r["tokens"]), r["what"], f"{1000 * r['seconds']:.1f}", f"{r['ratio']:.2f}")
    Console().print(table)
    if args.json:
        write_atomic(
            args.json,
            json.dumps(
                {
                    "model": args.model,
                    "threads": args.threads,
                    "sink": args.sink,
                    "recent": args.recent,
                    "block": args.block,
                    "rows": rows,
                },
                indent=2,
            )
            + "\n",
        )


if __name__ == "__main__":
    main()

"""The calibration run, as one linear script: load, shard, train the gates, rank, write the profile.

    duocal calibrate [RECIPE] [key=value ...] --output DIR [--nproc N] [--resume]

Workers launched by torchrun (or the deepspeed launcher) run `python -m duocal.calibrate.run
DIR/config.yaml --output DIR [--resume]`; with one process it runs in the caller's process.

Writes into DIR: `profile.json` (duocal profile v1; calibration settings and final losses in
`source`), `gates.png` (heatmap, layers x KV heads), `metrics.jsonl` (per step: step,
distill_loss, reg_loss, lr, tokens, seconds), `config.yaml` (the resolved recipe) and
`checkpoints/`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import time
import warnings
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

import duocal_runtime as dr
from duocal.calibrate import checkpoint, ranking, report
from duocal.calibrate import engine as ds
from duocal.calibrate.batches import StepData
from duocal.calibrate.gates import clamp_trainable_
from duocal.calibrate.model import build_objective, calibration_attention, check_recipe, load_frozen_model
from duocal.calibrate.nested_ranking import rerank_file
from duocal.calibrate.recipe import Recipe, load_resolved
from duocal.calibrate.ulysses import SequenceParallel
from duocal.reports.progress import LineProgress, stderr_line
from duocal.reports.progress_bar import progress_bar
from duocal_runtime.files.atomic import write_atomic


def lr_factor(step: int, total: int, warmup: float = 0.2, decay: float = 0.2, floor: float = 0.1) -> float:
    """Multiplier of the base lr at 0-based `step` of `total` (upstream `duo_attn/train.py`:
    `LambdaLR(lambda step: min(1, max((step+1)/(n//5), 0.1), max((n-step)/(n//5), 0.1)))`: linear
    warm-up over the first 20% of the n steps, flat, linear decay over the last 20%, never below
    0.1x). A function of the step, so a resumed run gets the same rates."""
    up = max(1, int(total * warmup)) if warmup > 0 else None
    down = max(1, int(total * decay)) if decay > 0 else None
    rise = max((step + 1) / up, floor) if up else 1.0
    fall = max((total - step) / down, floor) if down else 1.0
    return min(1.0, rise, fall)


def set_seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


class Metrics:
    """metrics.jsonl, one object per step (rank 0 writes); a resumed run drops the steps it redoes."""

    def __init__(self, path: Path, keep_until: int, active: bool):
        self.path, self.active = path, active
        if active:
            lines = path.read_text().splitlines() if path.is_file() else []
            kept = [line for line in lines if line.strip() and json.loads(line)["step"] <= keep_until]
            write_atomic(path, "".join(line + "\n" for line in kept))  # a kill here must not lose the log

    def write(self, record: dict) -> None:
        if self.active:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


def calibration_bar(active: bool):
    """Rank 0's bar on a terminal: step, losses and lr of the last step, elapsed time and ETA."""
    return progress_bar("calibrate", "{task.fields[losses]}", disable=not active)


@contextlib.contextmanager
def calibration_progress(active: bool, start: int, steps: int):
    """`report(done, losses)` for rank 0 on stderr: the bar on a terminal, plain periodic lines elsewhere
    ("calibrate: 120/400 (30%), 1:02 elapsed, ETA 2:24"; the losses are in metrics.jsonl); nothing on other ranks."""
    from rich.console import Console

    if active and not Console(stderr=True).is_terminal:
        with LineProgress("calibrate", stderr_line).beating() as lines:
            lines(start, steps, "calibrate")
            yield lambda done, losses: lines(done, steps, "calibrate")
        return
    with calibration_bar(active) as bar:
        task = bar.add_task("calibrate", total=steps, completed=start, losses="")
        yield lambda done, losses: bar.update(task, completed=done, losses=losses)


def calibrate(recipe: Recipe, output: str | Path, resume: bool = False) -> Path | None:
    """Run (or resume) a calibration into `output`; returns the profile path on rank 0."""
    output = Path(output)
    if recipe.train.threads:
        torch.set_num_threads(recipe.train.threads)
    with ds.process_group() as (rank, world):
        where = ds.Distributed(rank, world, recipe.deepspeed.sequence_parallel > 1)
        return _calibrate(recipe, output, resume, where)


def _calibrate(recipe: Recipe, output: Path, resume: bool, where: ds.Distributed) -> Path | None:
    checked = check_recipe(recipe, where.world)
    output.mkdir(parents=True, exist_ok=True)
    set_seed(recipe.train.seed)
    model = load_frozen_model(recipe)
    with calibration_attention(model):
        path = _train_and_rank(recipe, output, resume, where, checked, model)
    if path is not None and recipe.ranking.nested:  # the main process, the gated attention gone
        rerank_file(path, recipe, model, checked.tokenizer)
    return path


def _train_and_rank(recipe, output, resume, where: ds.Distributed, checked, model) -> Path | None:
    sequence_parallel = None
    if where.sequence_parallel:
        sequence_parallel = SequenceParallel.world(dr.shape_of_config(model.config).num_key_value_heads)
    objective = build_objective(model, recipe, sequence_parallel=sequence_parallel)
    t, pad, world = recipe.train, checked.pad_id, where.world
    data = StepData(checked.generator, pad, t.batch_size, t.micro_batch_size, world, where.sequence_parallel)
    config = ds.deepspeed_config(
        recipe.deepspeed,
        t.micro_batch_size,
        data.accumulation,
        world,
        recipe.model.dtype,
        objective.gates.weight.numel(),
    )
    engine = ds.initialize(objective, config, t.lr, t.betas)
    where = replace(where, device=engine.device)
    start = checkpoint.load(engine, output) if resume else 0
    metrics = Metrics(output / "metrics.jsonl", start, where.is_main)
    last: dict[str, float] = {}
    begun = time.perf_counter()
    with calibration_progress(where.is_main, start, t.steps) as report_progress:
        for step in range(start, t.steps):
            tic = time.perf_counter()
            clamp_trainable_(engine)  # upstream projects the gates onto [0, 1] before every step
            lr = t.lr * lr_factor(step, t.steps, t.warmup, t.decay, t.min_lr_ratio)
            ds.set_lr(engine, lr)
            distill = torch.zeros(())
            tokens = 0
            for micro in data.micro_batches(step, where.rank):
                micro = micro.to(engine.device)
                loss, d, reg = engine(micro.input_ids, micro.position_ids, micro.positions, micro.scale)
                engine.backward(loss)
                engine.step()
                distill += d.float().cpu() / (world * data.accumulation)
                tokens += micro.tokens
            distill, tokens = _all_reduce_sum(distill, tokens)
            last = {
                "step": step + 1,
                "distill_loss": distill,
                "reg_loss": float(reg),
                "lr": lr,
                "tokens": tokens,
                "seconds": round(time.perf_counter() - tic, 4),
            }
            metrics.write(last)
            report_progress(step + 1, f"distill {distill:.4g}  reg {float(reg):.3f}  lr {lr:.2e}")
            if recipe.checkpoint.every and (step + 1) % recipe.checkpoint.every == 0 and step + 1 < t.steps:
                checkpoint.save(engine, output, step + 1, recipe.checkpoint.keep)
    clamp_trainable_(engine)
    raw = ds.read_gates(engine)
    scores, ranking_info = ranking.rank_heads(recipe, engine.module, raw, checked.tokenizer, pad, where)
    result = report.CalibrationResult(raw, scores, ranking_info, last, time.perf_counter() - begun, world)
    return report.write_outputs(recipe, output, model.config, result) if where.is_main else None


def _all_reduce_sum(value: torch.Tensor, tokens: int) -> tuple[float, int]:
    both = torch.tensor([float(value), float(tokens)], dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(both)
    return float(both[0]), int(both[1])


def main(argv: list[str] | None = None) -> None:
    """Worker entry point (one per process): the resolved config written by `duocal calibrate`."""
    parser = argparse.ArgumentParser(prog="python -m duocal.calibrate.run")
    parser.add_argument("config", help="resolved config (DIR/config.yaml)")
    parser.add_argument("--output", required=True)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument(
        "--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS
    )  # deepspeed launcher
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    calibrate(load_resolved(args.config), args.output, args.resume)


if __name__ == "__main__":
    main()

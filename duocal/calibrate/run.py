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
import json
import os
import random
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from duocal_runtime.atomic import write_atomic

from duocal.calibrate import checkpoint, engine as ds
from duocal.calibrate.batches import StepData, make_generator
from duocal.calibrate.gated_attention import Gating, install
from duocal.calibrate.gates import Gates, clamp_trainable_
from duocal.calibrate.objective import GateObjective
from duocal.calibrate.recipe import Recipe, load_resolved
from duocal.calibrate.schedule import lr_factor
from duocal.models import resolve_model

DEMO_NAME = "duocal/demo-model"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_path(recipe: Recipe) -> str:
    """The folder (or Hub id) of the recipe's model: `demo`, a known name (fetched into the cache
    once), a local folder or a .gguf file (see duocal.models)."""
    if recipe.model.name_or_path == "demo":
        from duocal.demo import DEMO_MODEL_DIR

        return str(DEMO_MODEL_DIR)
    return resolve_model(recipe.model.name_or_path)


def model_name(recipe: Recipe) -> str:
    return DEMO_NAME if recipe.model.name_or_path == "demo" else recipe.model.name_or_path


def load_config_and_tokenizer(recipe: Recipe):
    from transformers import AutoConfig, AutoTokenizer

    path = model_path(recipe)
    try:
        config = AutoConfig.from_pretrained(path, revision=recipe.model.revision)
        tokenizer = AutoTokenizer.from_pretrained(path, revision=recipe.model.revision)
    except OSError as err:
        raise ValueError(f"cannot load model {recipe.model.name_or_path!r} ({path}): {err}") from None
    return config, tokenizer


@dataclass
class Checked:
    config: Any
    tokenizer: Any
    generator: Any


def validate(recipe: Recipe, nproc: int = 1) -> Checked:
    """Every check that needs the model's config and tokenizer but not its weights (cheap)."""
    from duocal_runtime.hf_compat import check_model_supported

    config, tokenizer = load_config_and_tokenizer(recipe)
    check_model_supported(config)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = getattr(text, "max_position_embeddings", None)
    longest = recipe.data.context if isinstance(recipe.data.context, int) else max(recipe.data.context)
    if limit is not None and longest > limit:
        raise ValueError(
            f"data.context goes up to {longest} tokens but {recipe.model.name_or_path} allows "
            f"{limit} (max_position_embeddings); lower data.context"
        )
    sp = recipe.deepspeed.sequence_parallel
    if sp > 1:
        kv = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        if sp != nproc:
            raise ValueError(f"deepspeed.sequence_parallel={sp} must equal the number of processes (--nproc {nproc})")
        if kv % sp:
            raise ValueError(f"deepspeed.sequence_parallel={sp} must divide the model's {kv} KV heads")
    StepData(None, 0, recipe.train.batch_size, recipe.train.micro_batch_size, nproc, sp > 1)  # batch arithmetic
    generator = make_generator(recipe.data, tokenizer)  # raises if the passkeys do not fit the context
    return Checked(config, tokenizer, generator)


def load_model(recipe: Recipe):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_path(recipe), revision=recipe.model.revision, dtype=DTYPES[recipe.model.dtype]
    )
    return model.eval()


def set_seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


class Metrics:
    """metrics.jsonl, one object per step (rank 0 writes); a resumed run drops the steps it redoes."""

    def __init__(self, path: Path, keep_until: int, active: bool):
        self.path, self.active = path, active
        if active:
            lines = path.read_text().splitlines() if path.is_file() else []
            kept = [l for l in lines if l.strip() and json.loads(l)["step"] <= keep_until]
            write_atomic(path, "".join(l + "\n" for l in kept))  # a kill here must not lose the log

    def write(self, record: dict) -> None:
        if self.active:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


def progress_bar(active: bool):
    """Rank 0's bar: step, losses and lr of the last step, elapsed time and ETA."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("calibrate"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[losses]}"),
        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), disable=not active,
    )


def calibrate(recipe: Recipe, output: str | Path, resume: bool = False) -> Path | None:
    """Run (or resume) a calibration into `output`; returns the profile path on rank 0."""
    output = Path(output)
    if recipe.train.threads:
        torch.set_num_threads(recipe.train.threads)
    with ds.process_group() as (rank, world):
        return _calibrate(recipe, output, resume, rank, world)


def _calibrate(recipe: Recipe, output: Path, resume: bool, rank: int, world: int) -> Path | None:
    from duocal.calibrate import ranking, report

    checked = validate(recipe, world)
    output.mkdir(parents=True, exist_ok=True)
    set_seed(recipe.train.seed)
    model = load_model(recipe)
    previous_attention = install(model)
    shape = model.config.get_text_config()
    kv_heads = getattr(shape, "num_key_value_heads", None) or shape.num_attention_heads
    sequence_parallel = None
    if recipe.deepspeed.sequence_parallel > 1:
        from duocal.calibrate.ulysses import SequenceParallel

        sequence_parallel = SequenceParallel.world(kv_heads)
    a = recipe.attention
    gating = Gating(a.sink, a.recent, a.block, sequence_parallel=sequence_parallel)
    gates = Gates(shape.num_hidden_layers, kv_heads, recipe.train.init)
    objective = GateObjective(model.get_decoder(), gates, gating, recipe.train.reg, recipe.train.activation_checkpointing)
    t = recipe.train
    pad = checked.tokenizer.pad_token_id if checked.tokenizer.pad_token_id is not None else 0
    data = StepData(checked.generator, pad, t.batch_size, t.micro_batch_size, world, sequence_parallel is not None)
    config = ds.deepspeed_config(recipe.deepspeed, t.micro_batch_size, data.accumulation, world,
                                 recipe.model.dtype, gates.weight.numel())
    engine = ds.initialize(objective, config, t.lr, t.betas)
    start = checkpoint.load(engine, output) if resume else 0
    metrics = Metrics(output / "metrics.jsonl", start, rank == 0)
    last: dict[str, float] = {}
    begun = time.perf_counter()
    with progress_bar(rank == 0) as bar:
        task = bar.add_task("calibrate", total=t.steps, completed=start, losses="")
        for step in range(start, t.steps):
            tic = time.perf_counter()
            clamp_trainable_(engine)  # upstream projects the gates onto [0, 1] before every step
            lr = t.lr * lr_factor(step, t.steps, t.warmup, t.decay, t.min_lr_ratio)
            ds.set_lr(engine, lr)
            distill = torch.zeros(())
            tokens = 0
            for micro in data.micro_batches(step, rank):
                micro = micro.to(engine.device)
                loss, d, reg = engine(micro.input_ids, micro.position_ids, micro.positions, micro.scale)
                engine.backward(loss)
                engine.step()
                distill += d.float().cpu() / (world * data.accumulation)
                tokens += micro.tokens
            distill, tokens = _all_reduce_sum(distill, tokens)
            last = {"step": step + 1, "distill_loss": distill, "reg_loss": float(reg), "lr": lr, "tokens": tokens,
                    "seconds": round(time.perf_counter() - tic, 4)}
            metrics.write(last)
            bar.update(task, advance=1, losses=f"distill {distill:.4g}  reg {float(reg):.3f}  lr {lr:.2e}")
            if recipe.checkpoint.every and (step + 1) % recipe.checkpoint.every == 0 and step + 1 < t.steps:
                checkpoint.save(engine, output, step + 1, recipe.checkpoint.keep)
    clamp_trainable_(engine)
    raw = ds.read_gates(engine)
    scores, ranking_info = ranking.rank_heads(recipe, engine.module, engine.device, raw, checked.tokenizer, pad, world,
                                              rank, sequence_parallel is not None)
    seconds = time.perf_counter() - begun
    path = None
    if rank == 0:
        path = report.write_outputs(recipe, output, model.config, raw, scores, ranking_info, last, seconds, world)
    from duocal.calibrate.gated_attention import uninstall

    uninstall(model, previous_attention)
    return path


def _all_reduce_sum(value: torch.Tensor, tokens: int) -> tuple[float, int]:
    import torch.distributed as dist

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
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)  # deepspeed launcher
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    calibrate(load_resolved(args.config), args.output, args.resume)


if __name__ == "__main__":
    main()

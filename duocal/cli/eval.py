"""`duocal eval ...`: measure what a plan costs in retrieval accuracy."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import duocal_runtime as dr

from ..demo import DEMO_MODEL_DIR
from ..eval.passkey import (
    DEFAULT_SEED, POLICIES, PasskeyEvalConfig, check_eval, default_format, evaluate_passkey, load_model,
    load_tokenizer,
)
from ..eval.report import plot_rows, render_table
from .errors import user_errors

eval_app = typer.Typer(help="Evaluate models under KV cache plans.", no_args_is_help=True)

DEMO_PROFILE = "demo-model.json"  # in profiles/ (package duocal_runtime.prebuilt), once calibrated


EXAMPLES = {"sparsity": "0.25,0.5", "contexts": "512,1024", "policies": "full,h2o"}


def split(text: str, cast, what: str) -> list:
    """'0.25, 0.5' -> [0.25, 0.5]; a `ValueError` that shows an example otherwise."""
    try:
        items = [cast(part.strip()) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"cannot read --{what} {text!r}: give a comma-separated list, e.g. "
                         f"--{what} {EXAMPLES[what]}") from None
    if not items:
        raise ValueError(f"--{what} is empty")
    return items


def default_profile(model: Path) -> Optional[str]:
    """The shipped demo profile, for the demo model, when the project ships one."""
    if default_format(model) != "demo":
        return None
    shipped = resources.files("duocal_runtime.prebuilt") / DEMO_PROFILE
    return str(shipped) if shipped.is_file() else None


@eval_app.command("passkey")
def passkey(
    model: Annotated[Path, typer.Option(help="Model folder (default: the bundled demo model).")] = DEMO_MODEL_DIR,
    profile: Annotated[Optional[str], typer.Option(
        help="Profile for 'duo': a file or prebuilt name (default for the demo model: profiles/demo-model.json "
             "when shipped).")] = None,
    sparsity: Annotated[str, typer.Option(help="Fractions of KV heads made non-retrieval (duo, h2o, random).")]
    = "0.25,0.5,0.75",
    policies: Annotated[Optional[str], typer.Option(
        help=f"Comma-separated, from {','.join(POLICIES)} (default: all; without a profile all but duo).")] = None,
    contexts: Annotated[str, typer.Option(help="Context lengths in tokens.")] = "512,1024",
    samples: Annotated[int, typer.Option(help="Samples per context (the same for every policy).")] = 40,
    seed: Annotated[int, typer.Option(help="Sample seed (the default is held out from the demo recipe).")]
    = DEFAULT_SEED,
    sink: Annotated[Optional[int], typer.Option(help="Sink tokens of streaming heads (default: the profile's, else 64).")]
    = None,
    recent: Annotated[Optional[int], typer.Option(
        help="Recent tokens of streaming heads (default: the profile's, else 256).")] = None,
    random_seeds: Annotated[int, typer.Option(help="Head draws for 'random' (mean, min, max).")] = 3,
    batch_size: Annotated[int, typer.Option(help="Sequences per generate() call (left padding).")] = 8,
    passkey_format: Annotated[Optional[str], typer.Option(
        "--format", help="Passkey format: demo, digits or nato (default: demo for the demo model, else digits).")]
    = None,
    haystack: Annotated[str, typer.Option(help="'synthetic', or a .txt / .jsonl file of filler text.")]
    = "synthetic",
    as_json: Annotated[bool, typer.Option("--json", help="Print only a JSON list of rows on stdout.")] = False,
    plot: Annotated[Path, typer.Option(help="Where to write the accuracy vs KV bytes PNG.")] = Path("passkey-eval.png"),
    no_plot: Annotated[bool, typer.Option("--no-plot", help="Do not write the PNG.")] = False,
):
    """Exact-match passkey retrieval through the per-head KV cache, per policy x context x sparsity.

    full: every head full. duo: the profile at each sparsity (its weakest heads on sink + recent).
    streaming: every head on sink + recent. h2o: every head on H2O with duo's KV bytes at each
    sparsity. random: as many heads as duo, drawn at random (several draws: mean, min, max).

    Examples:

      duocal eval passkey --contexts 512,1024 --samples 40 --policies full,streaming,h2o,random --sparsity 0.5

      duocal eval passkey --profile my-profile.json --sparsity 0.5,0.75 --sink 16 --recent 64 --json > rows.json
    """
    with user_errors():
        profile_ref = profile or default_profile(model)
        loaded = dr.load_profile(profile_ref) if profile_ref else None
        names = split(policies, str, "policies") if policies else [p for p in POLICIES if p != "duo" or loaded]
        config = PasskeyEvalConfig(
            policies=tuple(names), sparsities=tuple(split(sparsity, float, "sparsity")),
            contexts=tuple(split(contexts, int, "contexts")), samples=samples, seed=seed, sink=sink, recent=recent,
            random_seeds=random_seeds, batch_size=batch_size, format=passkey_format or default_format(model),
            haystack=haystack,
        )
        from transformers import AutoConfig

        tokenizer = load_tokenizer(model)
        check_eval(config, AutoConfig.from_pretrained(model), loaded, tokenizer)  # before loading the weights
        lm = load_model(model)
        err = Console(stderr=True)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err, transient=True) as bar:
            task = bar.add_task("passkey", total=None)
            rows = evaluate_passkey(lm, tokenizer, config, profile=loaded,
                                    progress=lambda done, total, label: bar.update(task, completed=done, total=total,
                                                                                  description=label))
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in rows], indent=2))
    else:
        window = config.window(loaded)
        render_table(rows, title=f"{model.name}: {config.samples} samples per context, seed {config.seed}, "
                                 f"sink {window.sink} + recent {window.recent}")
    if not no_plot:
        err.print(f"wrote {plot_rows(rows, plot, title=f'passkey retrieval, {model.name}')}")

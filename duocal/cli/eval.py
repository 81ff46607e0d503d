"""`duocal eval ...`: measure what a plan costs in retrieval accuracy."""

from __future__ import annotations

import contextlib
import json
from importlib import resources
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import duocal_runtime as dr

from ..demo import DEMO_MODEL_DIR
from ..eval.models import default_format, load_model, load_tokenizer
from ..eval.passkey import EVAL_SEED, PasskeyEvalConfig, check_eval, evaluate_passkey
from ..eval.variants import DEFAULT_ROWS, ROW_KINDS
from ..eval.perplexity import PerplexityConfig, evaluate_perplexity
from ..eval.tables import check_plot_path, plot_rows, render_ppl_table, render_table
from ..models import KNOWN_MODELS, resolve_model
from .errors import user_errors

eval_app = typer.Typer(help="Evaluate models under KV cache plans.", no_args_is_help=True)

DEMO_PROFILE = "demo-model.json"  # in profiles/ (package duocal_runtime.prebuilt), once calibrated
DEFAULT_TEXT = "gpl-3.0.txt"  # in duocal/assets/texts (see its README.md)


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


def default_profile(model: str | Path) -> Optional[str]:
    """The profile the project ships for this model (the demo model, or a known model by name), if any."""
    if default_format(model) == "demo":
        name = DEMO_PROFILE
    elif str(model) in KNOWN_MODELS and KNOWN_MODELS[str(model)].profile:
        name = KNOWN_MODELS[str(model)].profile
    else:
        return None
    shipped = resources.files("duocal_runtime.prebuilt") / name
    return str(shipped) if shipped.is_file() else None


@contextlib.contextmanager
def eval_progress(console: Console, label: str):
    """A transient bar on stderr; yields the `progress(done, total, label)` callback evaluations take."""
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task(label, total=None)
        yield lambda done, total, what: bar.update(task, completed=done, total=total, description=what)


ModelOpt = Annotated[Optional[str], typer.Option(
    help="A model folder, a .gguf file, or a known name (duocal models list); default: the bundled demo model.")]


@eval_app.command("passkey")
def passkey(
    model: ModelOpt = None,
    profile: Annotated[Optional[str], typer.Option(
        help="Profile for 'duo': a file or prebuilt name (default: the one the project ships for the model, "
             "e.g. profiles/demo-model.json).")] = None,
    sparsity: Annotated[str, typer.Option(help="Fractions of KV heads made non-retrieval (duo, h2o, random).")]
    = "0.25,0.5,0.75",
    policies: Annotated[Optional[str], typer.Option(
        help=f"Comma-separated, from {','.join(ROW_KINDS)} (default: all but mix; without a profile also not duo).")] = None,
    contexts: Annotated[str, typer.Option(help="Context lengths in tokens.")] = "512,1024",
    samples: Annotated[int, typer.Option(help="Samples per context (the same for every policy).")] = 40,
    seed: Annotated[int, typer.Option(help="Sample seed (the default is held out from the demo recipe).")]
    = EVAL_SEED,
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
    passkeys: Annotated[Optional[int], typer.Option(
        help="Needles per sample (1: the classic single-passkey task; default: 1 to 6).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print only a JSON list of rows on stdout.")] = False,
    plot: Annotated[Optional[Path], typer.Option(
        help="Where to write the accuracy vs KV bytes plot (.png/.pdf/.svg; default passkey-eval.png, none with "
             "--json unless given).")] = None,
    no_plot: Annotated[bool, typer.Option("--no-plot", help="Do not write the plot.")] = False,
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
        if plot is None and not as_json:
            plot = Path("passkey-eval.png")
        if plot is not None and not no_plot:
            check_plot_path(plot)
        model = model or str(DEMO_MODEL_DIR)
        profile_ref = profile or default_profile(model)
        model_dir = resolve_model(model)
        loaded = dr.load_profile(profile_ref) if profile_ref else None
        names = split(policies, str, "policies") if policies else [p for p in DEFAULT_ROWS if p != "duo" or loaded]
        config = PasskeyEvalConfig(
            policies=tuple(names), sparsities=tuple(split(sparsity, float, "sparsity")),
            contexts=tuple(split(contexts, int, "contexts")), samples=samples, seed=seed, sink=sink, recent=recent,
            random_seeds=random_seeds, batch_size=batch_size, format=passkey_format or default_format(model_dir),
            haystack=haystack, **({} if passkeys is None else {"num_passkeys": passkeys}),
        )
        from transformers import AutoConfig

        tokenizer = load_tokenizer(model_dir)
        check_eval(config, AutoConfig.from_pretrained(model_dir), loaded, tokenizer)  # before loading the weights
        lm = load_model(model_dir)
        err = Console(stderr=True)
        with eval_progress(err, "passkey") as progress:
            rows = evaluate_passkey(lm, tokenizer, config, profile=loaded, progress=progress)
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in rows], indent=2))
    else:
        window = config.window(loaded)
        render_table(rows, title=f"{Path(model).name}: {config.samples} samples per context, seed {config.seed}, "
                                 f"sink {window.sink} + recent {window.recent}")
    if plot is not None and not no_plot:
        try:
            err.print(f"wrote {plot_rows(rows, plot, title=f'passkey retrieval, {Path(model).name}')}")
        except Exception as exc:  # the results are printed: a plot must not fail the command
            err.print(f"warning: could not write the plot {plot}: {exc}")


@eval_app.command("ppl")
def ppl(
    model: ModelOpt = None,
    profile: Annotated[Optional[str], typer.Option(
        help="Profile for 'duo' (default: the one the project ships for the model).")] = None,
    text: Annotated[Optional[Path], typer.Option(
        help="A UTF-8 text file (default: the GPL-3.0 text shipped in duocal/assets/texts).")] = None,
    context: Annotated[int, typer.Option(help="Tokens per window.")] = 2048,
    scored: Annotated[Optional[int], typer.Option(help="Tokens scored at the end of each window (default: half).")]
    = None,
    chunk: Annotated[int, typer.Option(help="Scored tokens fed per forward pass (1: token by token).")] = 64,
    windows: Annotated[int, typer.Option(help="Most windows of CONTEXT tokens taken from the text.")] = 4,
    sparsity: Annotated[str, typer.Option(help="Fractions of KV heads made non-retrieval (duo, h2o, random).")]
    = "0.5",
    policies: Annotated[Optional[str], typer.Option(
        help=f"Comma-separated, from {','.join(ROW_KINDS)} (default: all but mix; without a profile also not duo).")] = None,
    sink: Annotated[Optional[int], typer.Option(help="Sink tokens of streaming heads (default: the profile's).")]
    = None,
    recent: Annotated[Optional[int], typer.Option(help="Recent tokens of streaming heads (default: the profile's).")]
    = None,
    random_seeds: Annotated[int, typer.Option(help="Head draws for 'random' (mean, min, max).")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print only a JSON list of rows on stdout.")] = False,
):
    """Perplexity of a long natural text under each plan, run through the per-head cache.

    Each window: a prefill of the unscored part, then the scored tokens in chunks through the
    cache (evicted tokens are gone; H2O evicts as it goes).

    Example: duocal eval ppl --model smollm2-135m-instruct --context 4096 --sparsity 0.5,0.75
    """
    with user_errors():
        model = model or str(DEMO_MODEL_DIR)
        profile_ref = profile or default_profile(model)
        loaded = dr.load_profile(profile_ref) if profile_ref else None
        names = split(policies, str, "policies") if policies else [p for p in DEFAULT_ROWS if p != "duo" or loaded]
        config = PerplexityConfig(policies=tuple(names), sparsities=tuple(split(sparsity, float, "sparsity")),
                                  context=context, scored=scored, chunk=chunk, windows=windows, sink=sink,
                                  recent=recent, random_seeds=random_seeds)
        source = text or Path(str(resources.files("duocal") / "assets" / "texts" / DEFAULT_TEXT))
        try:
            content = source.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"cannot read --text {source}: {err}") from None
        model_dir = resolve_model(model)
        lm, tokenizer = load_model(model_dir), load_tokenizer(model_dir)
        with eval_progress(Console(stderr=True), "ppl") as progress:
            rows = evaluate_perplexity(lm, tokenizer, content, config, profile=loaded, progress=progress)
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in rows], indent=2))
    else:
        window = config.window(loaded)
        render_ppl_table(rows, title=f"{Path(model).name}: {source.name}, sink {window.sink} + recent {window.recent}, "
                                     f"chunks of {config.chunk}")

"""`duocal profile [MODEL] --method attention ... --output P.json`: head profiling without training."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

import duocal_runtime as dr

from ..demo import DEMO_MODEL_DIR
from ..eval.models import default_format, load_model, load_tokenizer
from ..models import resolve_model
from ..profiling import ProfilerConfig, profile_model
from .errors import user_errors
from .eval import split

PROFILE_EPILOG = """Examples:

  duocal profile --output runs/demo-profiled.json          # the bundled demo model, passkey data

  duocal profile smollm2-135m-instruct --haystack repeated --contexts 2048 --samples 16 --output smol.json

  duocal profile ./my-model --data text --text book.txt --contexts 4096 --output mine.json
"""


def profile_command(
    model: Annotated[Optional[str], typer.Argument(
        help="A model folder, a .gguf file or a known name (default: the bundled demo model).")] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="Profile JSON to write (version 2).")] = ...,
    method: Annotated[str, typer.Option(help="How heads are measured (attention: the model's own).")] = "attention",
    data: Annotated[str, typer.Option(help="passkey (needles; gives the retrieval score) or text (--text FILE).")]
    = "passkey",
    text: Annotated[Optional[Path], typer.Option(help="A UTF-8 text file, for --data text.")] = None,
    samples: Annotated[int, typer.Option(help="Samples (text: windows at most) per context.")] = 8,
    contexts: Annotated[str, typer.Option(help="Context lengths in tokens.")] = "1024",
    sink: Annotated[Optional[int], typer.Option(help="Sink tokens of the measured policies (default: the "
                                                     "--scores-from profile's, else 16 for the demo model, else 64).")]
    = None,
    recent: Annotated[Optional[int], typer.Option(help="Recent tokens (default: the --scores-from profile's, else 64 "
                                                       "for the demo model, else 256).")] = None,
    passkey_format: Annotated[Optional[str], typer.Option("--format", help="Passkey format (default: demo for the "
                                                                             "demo model, else digits).")] = None,
    haystack: Annotated[str, typer.Option(help="synthetic, repeated, or a text file.")] = "synthetic",
    passkeys: Annotated[int, typer.Option(help="Needles per sample.")] = 1,
    seed: Annotated[int, typer.Option(help="Sample seed.")] = ProfilerConfig.seed,
    scores_from: Annotated[Optional[str], typer.Option(
        help="Keep the scores of this profile (e.g. calibrated gates) and add the measurements to them.")] = None,
):
    """Measure every (layer, KV head) from the model's own attention: retrieval score and the share
    of attention a sink window, H2O and sink + H2O would keep. Writes a version-2 profile whose
    scores rank heads like calibrated gates and whose measurements feed mixed plans."""
    with user_errors():
        if method != "attention":
            raise ValueError(f"unknown --method {method!r}; the profiler has: attention")
        model_ref = model or str(DEMO_MODEL_DIR)
        folder = resolve_model(model_ref)
        is_demo = default_format(folder) == "demo"
        body = None
        if text is not None:
            try:
                body = text.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as err:
                raise ValueError(f"cannot read --text {text}: {err}") from None
        base = dr.load_profile(scores_from) if scores_from else None
        default_sink, default_recent = default_window(base, is_demo)
        config = ProfilerConfig(
            data=data, text=body, samples=samples, contexts=tuple(split(contexts, int, "contexts")),
            format=passkey_format or default_format(folder), haystack=haystack,
            num_passkeys=passkeys, seed=seed, sink=default_sink if sink is None else sink,
            recent=default_recent if recent is None else recent,
        )
        name = "duocal/demo-model" if is_demo else model_ref
        lm = load_model(folder)
        if base is not None:
            base.check_compatible(lm.config)
        result = profile_model(lm, load_tokenizer(folder), config, name)
        if base is not None:
            result = with_measurements(base, result)
        dr.save_profile(result, output)
    typer.echo(f"wrote {output} ({result.shape.describe()}, measured in {measured_seconds(result)} s)")


def default_window(base: dr.Profile | None, is_demo: bool) -> tuple[int, int]:
    """(sink, recent) measured when not given: the window `base` deploys, else the model's usual one."""
    if base is not None:
        return base.deploy.sink, base.deploy.recent
    return (16, 64) if is_demo else (64, 256)


def with_measurements(base: dr.Profile, measured: dr.Profile) -> dr.Profile:
    """`base`'s scores and source, `measured`'s measurements, deploy sizes that plan the measured policies."""
    d = measured.deploy
    deploy = replace(base.deploy, sink=d.sink, recent=d.recent, heavy=d.heavy, h2o_recent=d.h2o_recent)
    source = {**base.source, "measured_by": measured.source}
    return replace(base, source=source, deploy=deploy, measurements=measured.measurements)


def measured_seconds(profile: dr.Profile) -> float:
    return profile.source.get("measured_by", profile.source).get("seconds")

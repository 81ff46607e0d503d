"""`duocal tune MODEL --profile P --output P2.json`: measure quality against KV memory per sparsity on the
user's data and write the profile again, deploying the largest sparsity within a tolerance of full attention."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from duocal.data.chat_prompts import FRAMINGS
from duocal.data.needle_values import VALUE_KINDS
from duocal.reports.progress import stderr_progress
from duocal.tuning.tune_data import PASSKEY_HAYSTACKS, TUNE_SEED, passkey_data, read_data
from duocal.tuning.tune_rule import DEFAULT_MAX_MISS, DEFAULT_TOLERANCE, Rule

from .eval import PLOT_FORMATS
from .options import JsonOpt, json_only_stdout, split
from .user_errors import user_errors

DEFAULT_SPARSITIES = "0.5,0.625,0.75,0.875,0.9375"
DEFAULT_CONTEXT = 1536
DEFAULT_SAMPLES = 12
DEFAULT_CONFIRM_SAMPLES = 8

TUNE_EPILOG = """Examples:

  duocal tune smollm2-135m-instruct --output smol-tuned.json --plot smol-tuned.png   # shipped profile, chat prompts

  duocal tune ./my-model --profile mine.json --data chats.jsonl --output mine-tuned.json --tolerance 0.1

  duocal tune ./my-model --profile mine.json --data book.txt --context 4096 --output mine-tuned.json

A chats.jsonl line: {"messages": [{"role": "user", "content": "..."}], "answer": "..."}
"""


def tune_command(
    model: Annotated[str, typer.Argument(help="A model folder, a .gguf file or a known name (duocal models list).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The profile to write (the chosen sparsity deploys).")],
    profile: Annotated[
        str | None, typer.Option(help="Profile to tune: a file or prebuilt name (default: the model's shipped one).")
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            help="Your data: a .jsonl of conversations with the expected answer (answer loss, exact match of the "
            "greedy answer) or a .txt file (perplexity); default: chat passkey prompts."
        ),
    ] = None,
    sparsities: Annotated[str, typer.Option(help="Sparsities measured (full attention is measured too).")] = (
        DEFAULT_SPARSITIES
    ),
    tolerance: Annotated[
        float, typer.Option(help="The most the loss per scored token may rise over full attention's, in nats.")
    ] = DEFAULT_TOLERANCE,
    max_miss: Annotated[
        float,
        typer.Option(
            help="Share of full attention's right answers (greedy, exact) a sparsity may lose, prompt by prompt."
        ),
    ] = DEFAULT_MAX_MISS,
    context: Annotated[
        int,
        typer.Option(help="Tokens KV memory is reported at; also the passkey prompts' and text windows' length."),
    ] = DEFAULT_CONTEXT,
    samples: Annotated[
        int, typer.Option(help="Passkey prompts the choice is measured on (text: the most windows, with the next).")
    ] = DEFAULT_SAMPLES,
    confirm_samples: Annotated[
        int, typer.Option(help="Passkey prompts the choice is confirmed on, other keys at 0.75x and 1.5x --context.")
    ] = DEFAULT_CONFIRM_SAMPLES,
    seed: Annotated[
        int, typer.Option(help="The passkey prompts' seed (another seed: held-out prompts to check a choice on).")
    ] = TUNE_SEED,
    haystack: Annotated[
        str, typer.Option(help="The passkey prompts' haystacks, mixed: repeated, text or both.")
    ] = ",".join(PASSKEY_HAYSTACKS),
    values: Annotated[
        str, typer.Option(help="The passkey prompts' values, mixed: number, word, uuid (any of them).")
    ] = ",".join(VALUE_KINDS),
    framing: Annotated[
        str, typer.Option(help="The passkey prompts' framings, mixed: chat (the chat template), plain or both.")
    ] = ",".join(FRAMINGS),
    plot: Annotated[Path | None, typer.Option(help="Write the curve as a plot (.png, .pdf or .svg).")] = None,
    as_json: JsonOpt = False,
):
    """Measure quality and KV memory per sparsity on your data, choose the largest sparsity whose quality
    stays within the tolerance of full attention, and write the profile deploying it, with a record of the
    measurement (`duocal profiles show` prints it; `dr.plan`, `duocal serve` and vLLM deploy it)."""
    from duocal_runtime.files.output_paths import check_output

    with user_errors():  # before the imports (seconds), the model and any work
        check_distinct_files({"--output": output, "--plot": plot, "--data": data})
        check_output(output, "--output")
        if plot is not None:
            check_output(plot, "--plot", suffixes=PLOT_FORMATS)
        rule = Rule(tolerance, max_miss)
        measured = checked_sparsities(sparsities)
        if context < 2 or samples < 1 or confirm_samples < 1:
            raise ValueError(
                "--context must be at least 2 tokens, --samples and --confirm-samples at least 1, "
                f"got {context}, {samples}, {confirm_samples}"
            )
        prompt_choices = {"--seed": (seed, TUNE_SEED), "--haystack": (haystack, ",".join(PASSKEY_HAYSTACKS))}
        prompt_choices |= {"--values": (values, ",".join(VALUE_KINDS)), "--framing": (framing, ",".join(FRAMINGS))}
        given = [option for option, (value, default) in prompt_choices.items() if value != default]
        if data is not None and given:
            raise ValueError(f"{', '.join(given)} choose the generated passkey prompts: leave them out with --data")
        lists = ((haystack, "haystack"), (values, "values"), (framing, "framing"))
        chosen_data = (
            passkey_data(samples, context, seed, *(tuple(split(text, str, what)) for text, what in lists))
            if data is None
            else read_data(data)
        )
    import duocal_runtime as dr
    from duocal.models import ModelRef
    from duocal.reports.tune_report import plot_tune_curve, render_tune_table
    from duocal.reports.tuned_record import TUNED
    from duocal.tuning.tune_curve import measure_curve, tokenized
    from duocal.tuning.tune_record import tune_record, tuned_profile
    from duocal.tuning.tune_rule import choose, to_confirm

    with user_errors(), json_only_stdout(as_json):
        ref = ModelRef.resolve(model)
        loaded = input_profile(dr, ref, profile)
        model_config = ref.load_config()
        loaded.check_compatible(model_config)
        tokenizer = ref.load_tokenizer()
        work, confirming = tokenized(chosen_data, tokenizer, model_config, samples, context, confirm_samples)
        lm = ref.load_model()  # after every refusal
        with stderr_progress("tune") as progress:
            points = measure_curve(lm, loaded, work, measured, context, progress, "measuring set: ")
            confirm_at = to_confirm(measured, choose(points, rule))  # the pick and every smaller sparsity
            confirmed = (
                measure_curve(lm, loaded, confirming, confirm_at, context, progress, "confirming set: ")
                if confirm_at
                else None
            )
        dtype = str(next(lm.parameters()).dtype).removeprefix("torch.")
        tuned = tuned_profile(loaded, tune_record(chosen_data, rule, points, confirmed, context, dtype, ref.name))
        record = tuned.source[TUNED]  # with the digest of what it describes
        dr.save_profile(tuned, output)
    if as_json:
        typer.echo(json.dumps(record, indent=2))
    else:
        render_tune_table(record)
    typer.echo(f"wrote {output} (deploys sparsity {record['chosen_sparsity']:g})", err=True)
    if plot is not None:
        try:
            typer.echo(f"wrote {plot_tune_curve(record, plot)}", err=True)
        except Exception as exc:  # the profile is written: a plot must not fail the command
            typer.echo(f"warning: could not write the plot {plot}: {exc}", err=True)


def check_distinct_files(paths: dict[str, Path | None]) -> None:
    """Refuse two options naming one file (symbolic and hard links followed): an output would replace the
    other output, or the user's data."""
    seen: dict[object, str] = {}
    for option, path in paths.items():
        if path is None:
            continue
        try:
            resolved = Path(path).resolve()
            key = (resolved.stat().st_dev, resolved.stat().st_ino) if resolved.exists() else resolved
        except (OSError, RuntimeError):  # a symlink loop, a name too long: check_output says so
            continue
        if key in seen:
            raise ValueError(
                f"{seen[key]} and {option} name the same file ({resolved}): writing one would replace "
                "the other; give different paths"
            )
        seen[key] = option


def checked_sparsities(text: str) -> tuple[float, ...]:
    values = tuple(split(text, float, "sparsities"))
    bad = [v for v in values if not 0.0 <= v <= 1.0]
    if bad:
        raise ValueError(f"--sparsities must be in [0, 1] (fractions of KV heads made bounded), got {bad[0]:g}")
    return values


def input_profile(dr, ref, profile: str | None):
    """The profile to tune: the one named, else the model's shipped one."""
    chosen = profile or ref.default_profile
    if chosen is None:
        raise ValueError(f"no profile ships for {ref.arg}: give --profile (make one with duocal profile)")
    return dr.load_profile(chosen)

"""`duocal eval ...`: measure what a plan costs in accuracy (passkey retrieval, perplexity)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Annotated

import typer

from duocal.reports.progress import stderr_progress

from .options import (
    CHAT_DEPTHS_TEXT,
    DepthsOpt,
    JsonOpt,
    KvBitsOpt,
    MixPoliciesOpt,
    ModelOpt,
    PositionsOpt,
    ProfileOpt,
    RandomSeedsOpt,
    RecentOpt,
    RowsOpt,
    SinkOpt,
    SparsityOpt,
    chosen_rows,
    json_only_stdout,
    split,
)
from .user_errors import user_errors

eval_app = typer.Typer(help="Evaluate models under KV cache plans.", no_args_is_help=True)

DEFAULT_TEXT = "gpl-3.0.txt"  # in duocal/assets/texts (see its README.md)
PLOT_FORMATS = (".png", ".pdf", ".svg", ".jpg", ".jpeg")  # what duocal.eval.tables.plot_rows saves (by suffix)


def model_and_profile(model: str | None, profile: str | None):
    """The resolved model (`ModelRef`) and the profile for its rows: the one given, else the shipped one."""
    import duocal_runtime as dr
    from duocal.models import ModelRef

    ref = ModelRef.resolve(model)
    chosen = profile or ref.default_profile
    return ref, (dr.load_profile(chosen) if chosen else None)


@eval_app.command("passkey")
def passkey(
    model: ModelOpt = None,
    profile: ProfileOpt = None,
    sparsity: Annotated[
        str | None,
        typer.Option(help="Fractions of KV heads made bounded (duo, h2o, random, mix; default: the profile's, 0.5)."),
    ] = None,
    rows: RowsOpt = None,
    contexts: Annotated[
        str | None, typer.Option(help="Context lengths in tokens (default: 2048; the demo model 512,1024).")
    ] = None,
    samples: Annotated[
        int | None, typer.Option(help="Samples per context, the same for every row (default: 8; demo model 40).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Sample seed (default: held out from the demo recipe).")] = None,
    sink: SinkOpt = None,
    recent: RecentOpt = None,
    positions: PositionsOpt = None,
    random_seeds: RandomSeedsOpt = 3,
    batch_size: Annotated[int, typer.Option(help="Sequences per generate() call (left padding).")] = 8,
    passkey_format: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="Passkey format: chat (the model's chat template, a question, a free answer scored exact and clean), "
            "or raw text: demo, digits or nato (default: demo for the demo model, else digits).",
        ),
    ] = None,
    haystack: Annotated[
        str | None,
        typer.Option(
            help="synthetic, repeated, text (the GPL-3.0 text), or a .txt / .jsonl file of filler text; chat takes "
            "repeated, text or a .txt file (default: repeated; the demo model synthetic)."
        ),
    ] = None,
    depths: DepthsOpt = CHAT_DEPTHS_TEXT,
    answer_tokens: Annotated[int, typer.Option(help="Chat format: the most tokens of the free answer.")] = 16,
    passkeys: Annotated[
        int | None,
        typer.Option(help="Needles per sample (1: the classic single-passkey task; default: 1; demo model 1 to 6)."),
    ] = None,
    protocol: Annotated[
        str,
        typer.Option(
            help="query-aware (question prefilled with the context), query-agnostic (context prefilled alone, each "
            "question asked after it on its own copy of the cache), multi-turn (context prefilled alone, the questions "
            "asked one after another on that one cache, after the model's own answers; needs --questions all), both "
            "(the first two) or all."
        ),
    ] = "query-aware",
    questions: Annotated[
        str,
        typer.Option(
            help="one (each sample asks for one of its passkeys) or all (for every one, in turn; query-aware "
            "prompts hold the earlier questions with their correct answers)."
        ),
    ] = "one",
    kv_bits: KvBitsOpt = "16",
    mix_policies: MixPoliciesOpt = "full,sink_window,h2o",
    as_json: JsonOpt = False,
    plot: Annotated[
        Path | None,
        typer.Option(
            help="Where to write the accuracy vs KV bytes plot (.png/.pdf/.svg; default passkey-eval.png, none with "
            "--json unless given)."
        ),
    ] = None,
    no_plot: Annotated[bool, typer.Option("--no-plot", help="Do not write the plot.")] = False,
):
    """Exact-match passkey retrieval through the per-head KV cache, per row x context x sparsity.

    Rows: full (every head full), duo (the profile at each sparsity: its weakest heads on sink +
    recent), streaming (every head on sink + recent), h2o (every head on H2O with duo's KV bytes),
    random (as many heads as duo, drawn at random; mean, min, max over draws), mix (a policy per
    head chosen by the profile's measurements at duo's bytes).

    Examples:

      duocal eval passkey --contexts 512,1024 --samples 40 --rows full,streaming,h2o,random --sparsity 0.5

      duocal eval passkey --profile my-profile.json --sparsity 0.5,0.75 --sink 16 --recent 64 --json > rows.json

      duocal eval passkey --model smollm2-135m-instruct --format chat --haystack text --contexts 1280 --rows full,duo
    """
    from duocal_runtime.files.output_paths import check_output

    with user_errors():  # before the imports (seconds) and any work
        if plot is not None and no_plot:
            raise ValueError("give --plot PATH or --no-plot, not both")
        if plot is None and not as_json:
            plot = Path("passkey-eval.png")
        if plot is not None and not no_plot:
            check_output(plot, "--plot", suffixes=PLOT_FORMATS)
    from duocal.eval.passkey_defaults import (
        default_contexts,
        default_sparsity,
        defaults_for,
        haystack_source,
    )
    from duocal.eval.passkey_retrieval import EVAL_SEED, PasskeyEvalConfig, check_eval, evaluate_passkey
    from duocal.eval.tables import plot_rows, render_table

    with user_errors(), json_only_stdout(as_json):
        ref, loaded = model_and_profile(model, profile)
        quick = defaults_for(ref.is_demo)
        chosen_format = passkey_format or ref.passkey_format
        if chosen_format == "chat" and passkeys is not None:
            raise ValueError("the chat format hides one key per prompt: leave --passkeys out")
        passkeys = quick.passkeys if passkeys is None else passkeys
        config = PasskeyEvalConfig(
            rows=chosen_rows(rows, loaded is not None),
            sparsities=tuple(split(default_sparsity(loaded) if sparsity is None else sparsity, float, "sparsity")),
            contexts=tuple(
                split(default_contexts(quick, ref.load_config()) if contexts is None else contexts, int, "contexts")
            ),
            samples=quick.samples if samples is None else samples,
            seed=EVAL_SEED if seed is None else seed,
            sink=sink,
            recent=recent,
            positions=positions,
            random_seeds=random_seeds,
            batch_size=batch_size,
            format=chosen_format,
            haystack=haystack_source(quick.haystack if haystack is None else haystack, chosen_format),
            depths=tuple(split(depths, float, "depths")),
            answer_tokens=answer_tokens,
            protocol=protocol,
            questions=questions,
            kv_bits=tuple(split(kv_bits, int, "kv-bits")),
            mix_policies=tuple(split(mix_policies, str, "mix-policies")),
            **({} if passkeys is None or chosen_format == "chat" else {"num_passkeys": passkeys}),
        )
        tokenizer = ref.load_tokenizer()
        check_eval(config, ref.load_config(), loaded, tokenizer)  # before loading the weights
        lm = ref.load_model()
        with stderr_progress("passkey") as progress:
            results = evaluate_passkey(lm, tokenizer, config, profile=loaded, progress=progress)
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        sink_window = config.sink_window(loaded)
        render_table(
            results,
            title=f"{Path(ref.arg).name}: {config.samples} samples per context, seed {config.seed},"
            f" sink {sink_window.sink} + recent {sink_window.recent}, {task_text(config)}",
        )
    if plot is not None and not no_plot:
        try:
            sink_window = config.sink_window(loaded)
            subtitle = (
                f"{config.samples} samples per context, seed {config.seed}, bounded heads: sink {sink_window.sink} "
                f"+ recent {sink_window.recent}, sparsity {', '.join(f'{s:g}' for s in config.sparsities)}"
            )
            written = plot_rows(results, plot, title=f"passkey retrieval, {ref.name}", subtitle=subtitle)
            typer.echo(f"wrote {written}", err=True)
        except Exception as exc:  # the results are printed: a plot must not fail the command
            typer.echo(f"warning: could not write the plot {plot}: {exc}", err=True)


def task_text(config) -> str:
    """What was asked, for the table's title: the format, haystack and needles (or the key's depths)."""
    haystack = Path(str(config.haystack)).name
    if config.format == "chat":
        depths = ", ".join(f"{d:g}" for d in config.depths)
        answer = f"free answers of up to {config.answer_tokens} tokens"
        return f"chat prompts ({answer}) in the {haystack} haystack, key at {depths}"
    needles = config.num_passkeys if isinstance(config.num_passkeys, int) else "{}-{}".format(*config.num_passkeys)
    return f"{config.format} passkeys ({needles} per sample) in the {haystack} haystack"


@eval_app.command("ppl")
def ppl(
    model: ModelOpt = None,
    profile: ProfileOpt = None,
    text: Annotated[
        Path | None,
        typer.Option(help="A UTF-8 text file (default: the GPL-3.0 text shipped in duocal/assets/texts)."),
    ] = None,
    context: Annotated[int, typer.Option(help="Tokens per text window.")] = 2048,
    scored: Annotated[
        int | None, typer.Option(help="Tokens scored at the end of each text window (default: half).")
    ] = None,
    chunk: Annotated[int, typer.Option(help="Scored tokens fed per forward pass (1: token by token).")] = 64,
    text_windows: Annotated[
        int | None, typer.Option(help="Most text windows of CONTEXT tokens taken from the text (default: 4).")
    ] = None,
    sparsity: SparsityOpt = "0.5",
    rows: RowsOpt = None,
    sink: SinkOpt = None,
    recent: RecentOpt = None,
    positions: PositionsOpt = None,
    random_seeds: RandomSeedsOpt = 3,
    kv_bits: KvBitsOpt = "16",
    baselines: Annotated[
        str | None,
        typer.Option(
            help="transformers' QuantizedCache rows on the same text windows: quanto4, hqq8, hqq4 "
            "(needs optimum-quanto / hqq: pip install -c constraints.txt -e '.[bench]')."
        ),
    ] = None,
    as_json: JsonOpt = False,
):
    """Perplexity of a long natural text under each row's plan, run through the per-head cache.

    Each text window: a prefill of the unscored part, then the scored tokens in chunks through the
    cache (evicted tokens are gone; H2O evicts as it goes).

    Example: duocal eval ppl --model smollm2-135m-instruct --context 4096 --sparsity 0.5,0.75
    """
    from duocal.eval.perplexity import PerplexityConfig, check_text_window_fits, evaluate_perplexity
    from duocal.eval.tables import render_ppl_table
    from duocal_runtime.files.regular_files import read_text

    with user_errors(), json_only_stdout(as_json):
        ref, loaded = model_and_profile(model, profile)
        config = PerplexityConfig(
            rows=chosen_rows(rows, loaded is not None),
            sparsities=tuple(split(sparsity, float, "sparsity")),
            context=context,
            scored=scored,
            chunk=chunk,
            text_windows=4 if text_windows is None else text_windows,
            sink=sink,
            recent=recent,
            positions=positions,
            random_seeds=random_seeds,
            kv_bits=tuple(split(kv_bits, int, "kv-bits")),
            baselines=() if baselines is None else tuple(split(baselines, str, "baselines")),
        )
        source = text or Path(str(resources.files("duocal") / "assets" / "texts" / DEFAULT_TEXT))
        content = read_text(source, "--text")
        check_text_window_fits(config, ref.load_config(), loaded)  # before loading the weights
        lm, tokenizer = ref.load_model(), ref.load_tokenizer()
        with stderr_progress("ppl") as progress:
            results = evaluate_perplexity(lm, tokenizer, content, config, profile=loaded, progress=progress)
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        sink_window = config.sink_window(loaded)
        render_ppl_table(
            results,
            title=f"{Path(ref.arg).name}: {source.name}, sink {sink_window.sink} + recent "
            f"{sink_window.recent}, chunks of {config.chunk}",
        )

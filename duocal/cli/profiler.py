"""`duocal profile [MODEL] --method attention ... --output P.json`: head profiling without training."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from duocal.profiling import PROFILER_SEED
from duocal.reports.progress import stderr_progress
from duocal_runtime.profile import VERSION as PROFILE_VERSION

from .options import CHAT_DEPTHS_TEXT, DepthsOpt, split
from .user_errors import user_errors

CHAT_PROFILE_HAYSTACKS = "repeated,text"  # the chat format's default: both haystacks, prompts alternating
# The chat format's defaults: 8 prompts (4 per haystack) at 1536 tokens (on SmolLM2, 8 at 1024 ranked heads that lost
# 26 of 48 answers of full attention at 0.5 on held-out 1536-token prompts; these lose none at 0.5 and 0.75, as
# 16 prompts did, in half the time: benchmarks/tune.md).
CHAT_DEFAULTS = {"samples": 8, "contexts": "1536"}
OTHER_DEFAULTS = {"samples": 8, "contexts": "1024"}


def default_for(chosen_format: str, option: str):
    """`--samples` / `--contexts` when left out: the chat format's own, or the other formats'."""
    return (CHAT_DEFAULTS if chosen_format == "chat" else OTHER_DEFAULTS)[option]


PROFILER_EPILOG = """Examples:

  duocal profile --output runs/demo-profiled.json          # the bundled demo model, passkey data

  duocal profile smollm2-135m-instruct --output smol.json        # chat prompts, heads ranked by the answer's loss

  duocal profile smollm2-135m-instruct --loss-at-sparsity 0.75 --output smol75.json   # ranked for plans at 0.75

  duocal profile smollm2-135m-instruct --format digits --haystack repeated --contexts 2048 --output raw.json

  duocal profile ./my-model --data text --text book.txt --contexts 4096 --output mine.json
"""


def profiler_command(
    model: Annotated[
        str | None,
        typer.Argument(help="A model folder, a .gguf file or a known name (default: the bundled demo model)."),
    ] = None,
    output: Annotated[
        Path, typer.Option("--output", "-o", help=f"Profile JSON to write (format version {PROFILE_VERSION}).")
    ] = ...,
    method: Annotated[str, typer.Option(help="How heads are measured (attention: the model's own).")] = "attention",
    data: Annotated[
        str, typer.Option(help="passkey (needles; gives the retrieval score) or text (--text FILE).")
    ] = "passkey",
    text: Annotated[Path | None, typer.Option(help="A UTF-8 text file, for --data text.")] = None,
    samples: Annotated[
        int | None,
        typer.Option(help="Samples (text: text windows at most) per context (default: 8)."),
    ] = None,
    contexts: Annotated[
        str | None, typer.Option(help="Context lengths in tokens (default: 1536 for chat, else 1024).")
    ] = None,
    sink: Annotated[
        int | None,
        typer.Option(
            help="Sink tokens of the measured policies (default: the "
            "--scores-from profile's, else the model's usual sink window)."
        ),
    ] = None,
    recent: Annotated[
        int | None,
        typer.Option(
            help="Recent tokens (default: the --scores-from profile's, else "
            "the model's usual sink window: 16 + 64 for the demo model, the "
            "shipped profile's for a known model, else 64 + 256)."
        ),
    ] = None,
    passkey_format: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="Passkey format: chat (the model's chat template, a question and its answer written out), digits, "
            "nato or demo (default: chat when the tokenizer has a chat template, demo for the demo model, else "
            "digits).",
        ),
    ] = None,
    haystack: Annotated[
        str | None,
        typer.Option(
            help="synthetic, repeated, text (chat: the GPL-3.0 text) or a text file; the chat format takes several, "
            "its prompts alternating between them (default: repeated,text for chat, else synthetic)."
        ),
    ] = None,
    depths: DepthsOpt = CHAT_DEPTHS_TEXT,
    values: Annotated[
        str,
        typer.Option(
            help="The chat format's keys, mixed: number (README's 71432), word (amber-falcon), uuid; any of them."
        ),
    ] = "number",
    framing: Annotated[
        str,
        typer.Option(
            help="The chat format's framings, mixed: chat (the chat template), plain (text ending in 'The pass key "
            "is'), or both."
        ),
    ] = "chat",
    score: Annotated[
        str | None,
        typer.Option(
            help="What ranks heads: loss (the answer's first-order loss rise when the head alone streams), retrieval "
            "(attention on the needle) or kept (1 - the sink window's kept share) (default: loss for chat, retrieval "
            "for other passkeys, kept for text)."
        ),
    ] = None,
    loss_at_sparsity: Annotated[
        float | None,
        typer.Option(
            help="Measure the loss score with the gates at the plan for this sparsity (0 < S < 1; heads the "
            "plan bounds at 0, the others at 1), re-planned from the scores for up to 4 rounds, instead of "
            "with every gate at 1: for plans at S. The profile deploys at S and its source records S.",
        ),
    ] = None,
    nested: Annotated[
        bool,
        typer.Option(
            "--nested",
            help="Order the heads sparsest plan first: the loss score picks the 0.9375 plan's heads, then each of "
            "0.875, 0.75, 0.625 and 0.5 adds the heads whose loss gain, measured at the plan so far, is largest "
            "(5 more passes).",
        ),
    ] = False,
    answer: Annotated[
        str,
        typer.Option(
            help="What the chat format's loss score scores: full attention's own greedy answer where it is exact and "
            'clean, else the written answer "The pass key is K." (right); its own answer always (own); '
            "the written answer always (written)."
        ),
    ] = "right",
    passkeys: Annotated[int, typer.Option(help="Needles per sample.")] = 1,
    seed: Annotated[int, typer.Option(help="Sample seed.")] = PROFILER_SEED,
    scores_from: Annotated[
        str | None,
        typer.Option(help="Keep the scores of this profile (e.g. calibrated gates) and add the measurements to them."),
    ] = None,
    protocol: Annotated[
        str,
        typer.Option(
            help="When the question comes, for snapkv's kept share: query-aware (in the prompt) or query-agnostic "
            "(after the context: snapkv selects at the context's end, then again at the question's)."
        ),
    ] = "query-aware",
    kv_bits: Annotated[
        str,
        typer.Option(
            help="Widths whose error on full heads' outputs is measured (error:full-kv8, error:full-kv4), so "
            "plans can mix widths per head: 8,4, one of them, or none."
        ),
    ] = "8,4",
):
    """Measure every (layer, KV head) from the model's own attention: retrieval score and the share
    of attention a sink window, H2O, sink + H2O and SnapKV would keep, and the error 8- and 4-bit
    codes add to its output. Writes a profile (the format version --output names) whose
    scores rank heads like calibrated gates and whose measurements feed mixed plans."""
    from duocal_runtime.files.output_paths import check_output

    with user_errors():
        check_output(output, "--output")  # before the imports (seconds) and the measurement, not after them
    import duocal_runtime as dr
    from duocal.models import ModelRef
    from duocal.profiling import ProfilerConfig, profile_model, with_measurements
    from duocal.profiling.profiler import check_contexts_fit
    from duocal_runtime.files.regular_files import read_text

    with user_errors():
        if method != "attention":
            raise ValueError(f"unknown --method {method!r}; the profiler has: attention")
        ref = ModelRef.resolve(model)
        body = None if text is None else read_text(text, "--text")
        tokenizer = ref.load_tokenizer()
        chosen_format = passkey_format or default_format(ref, tokenizer, data)
        if scores_from and (loss_at_sparsity is not None or nested):
            raise ValueError(
                "--loss-at-sparsity and --nested rank the heads, --scores-from keeps another profile's ranking: give "
                "one of them"
            )
        base = dr.load_profile(scores_from) if scores_from else None
        default_sink, default_recent = (
            (base.deploy.sink_window.sink, base.deploy.sink_window.recent) if base else ref.sink_window
        )
        config = ProfilerConfig(
            data=data,
            text=body,
            samples=default_for(chosen_format, "samples") if samples is None else samples,
            contexts=tuple(
                split(default_for(chosen_format, "contexts") if contexts is None else contexts, int, "contexts")
            ),
            format=chosen_format,
            haystack=haystack or (CHAT_PROFILE_HAYSTACKS if chosen_format == "chat" else "synthetic"),
            answer=answer,
            depths=tuple(split(depths, float, "depths")),
            values=tuple(split(values, str, "values")),
            framings=tuple(split(framing, str, "framing")),
            score=score,
            loss_at_sparsity=loss_at_sparsity,
            nested=nested,
            num_passkeys=passkeys,
            seed=seed,
            sink=default_sink if sink is None else sink,
            recent=default_recent if recent is None else recent,
            protocol=protocol,
            kv_bits=() if kv_bits.strip() == "none" else tuple(split(kv_bits, int, "kv-bits")),
        )
        model_config = ref.load_config()
        check_contexts_fit(config, model_config)  # before the weights load
        if base is not None:
            base.check_compatible(model_config)
        lm = ref.load_model()
        with stderr_progress("profile") as progress:
            result = profile_model(lm, tokenizer, config, ref.name, progress=progress)
        if base is not None:
            result = with_measurements(base, result)
        dr.save_profile(result, output)
    typer.echo(f"wrote {output} ({result.shape.describe()}, measured in {measured_seconds(result)} s)")


def default_format(ref, tokenizer, data: str) -> str:
    """chat for a passkey profile of a model with a chat template (what its users send), else the model's format."""
    if data == "passkey" and not ref.is_demo and getattr(tokenizer, "chat_template", None):
        return "chat"
    return ref.passkey_format


def measured_seconds(profile) -> float:
    return profile.source.get("measured_by", profile.source).get("seconds")

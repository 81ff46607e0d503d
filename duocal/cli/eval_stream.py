"""`duocal eval stream`: perplexity of one long stream through one cache, per bucket, per row."""

from __future__ import annotations

import contextlib
import json
from typing import Annotated

import typer

from duocal.reports.progress import stderr_progress

from .eval import PLOT_FORMATS, eval_app, model_and_profile
from .options import ModelOpt, ProfileOpt, json_only_stdout, split
from .user_errors import user_errors

STREAM_LENGTHS = 32  # default --tokens: this many times the model's trained length
STREAM_EPILOG = (
    "Example: duocal eval stream --model smollm2-135m-instruct --tokens 1048576 --bucket 65536 "
    "--fresh-checks 4 --plot stream.png --json stream.json"
)


@eval_app.command("stream", epilog=STREAM_EPILOG)
def stream(
    model: ModelOpt = None,
    profile: ProfileOpt = None,
    text: Annotated[
        str | None,
        typer.Option(help="A UTF-8 text file, a fifo, or '-' for stdin, read as it goes (default: a built-in text)."),
    ] = None,
    tokens: Annotated[
        int | None, typer.Option(help=f"Tokens to stream (default: {STREAM_LENGTHS}x the model's trained length).")
    ] = None,
    bucket: Annotated[
        int | None, typer.Option(help="Tokens per perplexity bucket (default: the trained length, in chunks).")
    ] = None,
    chunk: Annotated[int, typer.Option(help="Tokens fed per forward pass.")] = 1024,
    rows: Annotated[
        str | None,
        typer.Option(
            help="Rows, comma-separated: full, streaming-original, streaming, duo (default: all; duo with a profile)."
        ),
    ] = None,
    sink: Annotated[int, typer.Option(help="Sink tokens of the sink-window heads.")] = 4,
    recent: Annotated[int, typer.Option(help="Recent tokens of the sink-window heads.")] = 1020,
    sparsity: Annotated[float | None, typer.Option(help="The duo row's sparsity (default: the profile's).")] = None,
    positions: Annotated[
        str, typer.Option(help="What the duo row's sink windows see: original positions or positions in the cache.")
    ] = "original",
    full_kv_limit: Annotated[
        str, typer.Option(help="Rows with full heads stop before their KV cache passes this ('1GiB').")
    ] = "1GiB",
    time_limit: Annotated[
        float | None, typer.Option(help="Seconds a row with full heads may run before it stops (default: no limit).")
    ] = None,
    fresh_checks: Annotated[
        int, typer.Option(help="Buckets of the streaming row fed again from position 0 after a warm-up, to compare.")
    ] = 0,
    resolution: Annotated[
        int | None, typer.Option(help="Tokens per point of the plot and of the JSON's points (default: --chunk).")
    ] = None,
    broken_ratio: Annotated[
        float,
        typer.Option(
            help="Stop a row whose distances grow (full, streaming-original, duo) once two points in a row pass this "
            "times its best perplexity (0: never)."
        ),
    ] = 0.0,
    json_path: Annotated[
        str | None, typer.Option("--json", help="Write every bucket as JSON here ('-': stdout).")
    ] = None,
    plot: Annotated[str | None, typer.Option(help="Draw perplexity against tokens here (.png, .pdf, .svg).")] = None,
):
    """StreamingLLM's measurement: one stream of text through one cache per row (no cache is ever reset),
    scored in buckets: perplexity, KV bytes, resident memory and tokens/s. `streaming` (every head a sink
    window that sees positions within its cache) holds its perplexity and memory at any length;
    `streaming-original`, `full` (dense attention, until --full-kv-limit) and `duo` show what breaks past
    the trained length.
    """
    from duocal.eval.stream import STREAM_ROWS, StreamConfig, evaluate_stream, rows_to_dict, stream_plans
    from duocal.eval.stream_report import plot_stream, render_stream_table
    from duocal.eval.stream_text import TokenTape, text_pieces
    from duocal_runtime.files.atomic import write_atomic
    from duocal_runtime.files.output_paths import check_output
    from duocal_runtime.hf.apply import trained_positions

    to_stdout = json_path == "-"
    with user_errors(), json_only_stdout(to_stdout):
        for path, what, suffixes in ((json_path, "--json", ()), (plot, "--plot", PLOT_FORMATS)):
            if path is not None and path != "-":
                check_output(path, what, suffixes=suffixes)
        ref, loaded = model_and_profile(model, profile)
        model_config = ref.load_config()
        trained = trained_positions(model_config)
        bucket = bucket if bucket is not None else max(chunk, trained // chunk * chunk)
        chosen = tuple(split(rows, str, "rows")) if rows else tuple(r for r in STREAM_ROWS if r != "duo" or loaded)
        config = StreamConfig(
            tokens=STREAM_LENGTHS * trained if tokens is None else tokens,
            bucket=bucket,
            chunk=chunk,
            rows=chosen,
            sink=sink,
            recent=recent,
            sparsity=sparsity,
            duo_positions=positions,
            full_kv_limit=kv_limit(full_kv_limit),
            fresh_checks=fresh_checks,
            broken_ratio=broken_ratio,
            resolution=resolution,
            time_limit=time_limit,
        )
        stream_plans(config, model_config, loaded)  # what a row cannot run is refused before the weights load
        with contextlib.closing(TokenTape(ref.load_tokenizer(), text_pieces(text), config.tokens)) as tape:
            first = len(tape.take(config.bucket))  # before the weights load: a text shorter than a bucket is refused
            if first < config.bucket:
                raise ValueError(
                    f"the text holds {first:,} tokens, less than one bucket ({config.bucket:,}): give more text"
                )
            lm = ref.load_model()
            with stderr_progress("stream") as progress:
                results = evaluate_stream(lm, tape, config, loaded, progress)
        document = json.dumps(rows_to_dict(results, config, trained), indent=2)
        if json_path and not to_stdout:
            write_atomic(json_path, document + "\n")
        if plot:
            plot_stream(results, plot, trained, title=f"{ref.name}: sink {sink} + recent {recent}")
    if to_stdout:
        typer.echo(document)
        return
    render_stream_table(
        results, title=f"{ref.name}: {config.tokens:,} tokens in buckets of {config.bucket:,}, trained on {trained:,}"
    )


def kv_limit(text: str) -> int:
    from duocal_runtime.planning.budget import Budget

    limit = Budget.parse(text)
    if limit.unit != "bytes" or limit.amount < 1:
        raise ValueError(f"--full-kv-limit takes a size in bytes ('1GiB', '500MB'), got {text!r}")
    return int(limit.amount)

"""Option types shared by the commands, and the parsing they share (lists, rows)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from duocal.eval import ROW_NAMES

ModelOpt = Annotated[
    str | None,
    typer.Option(
        help="A model folder, a .gguf file, or a known name (duocal models list); default: the bundled demo model."
    ),
]
ProfileOpt = Annotated[
    str | None,
    typer.Option(
        help="Profile for duo and mix: a file or prebuilt name (default: the one the project ships for the model)."
    ),
]
SparsityOpt = Annotated[str, typer.Option(help="Fractions of KV heads made bounded (duo, h2o, random, mix).")]
RowsOpt = Annotated[
    str | None,
    typer.Option(
        help=f"Evaluation rows, comma-separated, from {','.join(ROW_NAMES)} (default: all but mix; without a "
        "profile also not duo)."
    ),
]
MixPoliciesOpt = Annotated[
    str,
    typer.Option(help="What the mix row chooses among per head, by the profile's measurements (full and others)."),
]
SinkOpt = Annotated[int | None, typer.Option(help="Sink tokens of sink-window heads (default: the profile's).")]
RecentOpt = Annotated[int | None, typer.Option(help="Recent tokens of sink-window heads (default: the profile's).")]
PositionsOpt = Annotated[
    str | None,
    typer.Option(
        help="What the sink windows of duo and random see: original (DuoAttention) or cache (positions within "
        "it; default: the profile's, else original). The streaming row always sees cache positions."
    ),
]
KvBitsOpt = Annotated[
    str,
    typer.Option(help="Bits full heads store keys and values in, one row each: 16, 8, 4 (KIVI codes below 16)."),
]
RandomSeedsOpt = Annotated[int, typer.Option(help="Head draws for 'random' (mean, min, max).")]
DepthsOpt = Annotated[
    str, typer.Option(help="Chat format: where the key sits in the haystack (0 start, 1 end), in turn.")
]
CHAT_DEPTHS_TEXT = "0.25,0.5,0.75"  # duocal.data.chat_prompts.CHAT_DEPTHS, without importing it here
JsonOpt = Annotated[bool, typer.Option("--json", help="Print only JSON on stdout.")]
OutputFileOpt = Annotated[Path, typer.Option("--output", "-o", help="Profile JSON to write.")]

EXAMPLES = {"sparsity": "0.25,0.5", "contexts": "512,1024", "rows": "full,h2o", "kv-bits": "16,4"}


def split(text: str, cast, what: str) -> list:
    """'0.25, 0.5' -> [0.25, 0.5]; a `ValueError` that shows an example otherwise."""
    try:
        items = [cast(part.strip()) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(
            f"cannot read --{what} {text!r}: give a comma-separated list, e.g. --{what} {EXAMPLES.get(what, '1,2')}"
        ) from None
    if not items:
        raise ValueError(f"--{what} is empty")
    return items


def chosen_rows(rows: str | None, has_profile: bool) -> tuple[str, ...]:
    """The rows named by --rows, else the defaults."""
    from duocal.eval.row_kinds import default_rows

    return tuple(split(rows, str, "rows")) if rows is not None else default_rows(has_profile)


@contextlib.contextmanager
def json_only_stdout(active: bool):
    """With --json, stdout is the JSON document alone: whatever is printed meanwhile (other libraries'
    logs, subprocesses, C extensions) goes to stderr, at the file-descriptor level."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)

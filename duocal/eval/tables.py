"""Evaluation rows for people: rich tables (passkey, perplexity) and a PNG of accuracy versus KV bytes."""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from duocal.eval.passkey_retrieval import PasskeyRow
from duocal.eval.perplexity import PerplexityRow
from duocal.eval.row_kinds import ROWS
from duocal.reports.terminal import simple_head_box, table_console
from duocal_runtime.files.atomic import write_atomic
from duocal_runtime.planning.sizes import byte_unit, human_bytes
from duocal_runtime.quant.hf_baselines import HF_QUANTIZED

PROTOCOL_MARKS = {"query-aware": "", "query-agnostic": " (q after)", "multi-turn": " (turns)"}


def row_name(row) -> str:
    """The row kind, marked with its KV bits below 16 and when the questions came after the context
    (query-agnostic: each on a copy of the context's cache; multi-turn: in turn on one cache)."""
    if row.row in HF_QUANTIZED:  # its bits are in its name
        return f"{row.row} (transformers QuantizedCache)"
    name = row.row + (f" kv{row.kv_bits}" if getattr(row, "kv_bits", 16) != 16 else "")
    return name + PROTOCOL_MARKS[getattr(row, "protocol", "query-aware")]


def exact_match_text(row: PasskeyRow) -> str:
    """'0.450', with the min-max over seeds on a second line: '0.450\n[0.20-0.70]'."""
    text = f"{row.exact_match:.3f}"
    if row.min is not None:
        text += f"\n[{row.min:.2f}-{row.max:.2f}]"
    return text


def heads_text(row: PasskeyRow) -> str:
    """'12/16 sink_window 64+256': bounded heads of all, their policy and sizes ('(cache)': positions within it)."""
    sizes = dict(row.head_policy or {"policy": "full"})
    name = sizes.pop("policy")
    options = "".join(f" ({value})" for value in sizes.values() if isinstance(value, str))
    numbers = "+".join(str(value) for value in sizes.values() if not isinstance(value, str))
    return f"{row.bounded_heads}/{row.num_heads} {name} {numbers}".rstrip() + options


def compact_table(console: Console, title: str | None) -> Table:
    """A table that fits 80 columns: two spaces between columns, none at the edges, a rule under the
    header (in ASCII where UTF-8 would come out mangled)."""
    return Table(title=title, box=simple_head_box(console), padding=(0, 1, 0, 0), show_edge=False)


def render_ppl_table(rows: Sequence[PerplexityRow], console: Console | None = None, title: str | None = None) -> None:
    """Row x sparsity -> perplexity, tokens scored, KV bytes and fraction of full."""
    console = console or table_console()
    table = compact_table(console, title)
    for name in ("row", "context", "sparsity", "ppl", "tokens scored", "KV bytes", "of full"):
        table.add_column(name, justify="left" if name == "row" else "right", no_wrap=name != "row")
    for row in rows:
        ppl = f"{row.ppl:.3f}" + (f"\n[{min(row.per_seed):.2f}-{max(row.per_seed):.2f}]" if row.per_seed else "")
        table.add_row(
            row_name(row),
            str(row.context),
            f"{row.sparsity:g}",
            ppl,
            str(row.tokens_scored),
            human_bytes(row.kv_bytes),
            f"{row.fraction_of_full:.3f}",
        )
    console.print(table)


def sampled_row_label(row: PasskeyRow) -> str:
    """The row's name, with its seeds (random) and questions asked when there are several."""
    label = row_name(row) + (f" ({len(row.seeds)} seeds)" if row.seeds else "")
    return label + (f" ({row.questions} q)" if getattr(row, "questions", None) else "")


# the wrapping columns: row names fold past 10 characters, '16/16 sink_window' stays on one line
WIDTHS = {"row": {"max_width": 10}, "bounded heads": {"min_width": 17}}

PASSKEY_COLUMNS = (
    "exact match: share of answers that are the key; KV bytes: one sequence's cache at the context "
    "(held: what the cache held at the end); of full: KV bytes / full attention's; bounded heads: "
    "KV heads on a bounded policy, of all (their share is the sparsity)"
)
CLEAN_COLUMN = "clean: share of answers that repeat no 3-word phrase before their first number (not garbled)"


def full_first(rows: Sequence[PasskeyRow]) -> list[PasskeyRow]:
    """Per context (in their order), full attention's row (the reference) first, the others in their order."""
    contexts = {c: i for i, c in enumerate(dict.fromkeys(r.context for r in rows))}
    return sorted(rows, key=lambda r: (contexts[r.context], r.row != "full"))


def render_table(rows: Sequence[PasskeyRow], console: Console | None = None, title: str | None = None) -> None:
    """Row x context x sparsity -> exact match (and clean, for chat prompts), KV bytes (analytic at the
    context, and held at the end of generation), share of full attention's, the bounded heads; full
    attention first, a caption saying what the columns mean. Fits 80 columns: row names and head
    policies wrap; samples per context belong in the title."""
    console = console or table_console()
    chat = any("clean" in r.extra for r in rows)
    table = compact_table(console, title)
    table.caption, table.caption_justify = PASSKEY_COLUMNS + ("; " + CLEAN_COLUMN if chat else ""), "left"
    for name, justify in (
        ("row", "left"),
        ("context", "right"),
        ("exact\nmatch", "right"),
        *((("clean", "right"),) if chat else ()),
        ("KV bytes", "right"),
        ("held", "right"),
        ("of\nfull", "right"),
        ("bounded heads", "left"),
    ):
        table.add_column(name, justify=justify, no_wrap=name not in ("row", "bounded heads"), **WIDTHS.get(name, {}))
    for row in full_first(rows):
        table.add_row(
            sampled_row_label(row),
            str(row.context),
            exact_match_text(row),
            *((f"{row.extra['clean']:.3f}",) if chat else ()),
            human_bytes(row.kv_bytes),
            human_bytes(row.kv_bytes_measured),
            f"{row.fraction_of_full:.0%}",
            heads_text(row),
        )
    console.print(table)


def plot_rows(rows: Sequence[PasskeyRow], path: str | Path, title: str | None = None, subtitle: str = "") -> Path:
    """One panel per context: exact match against analytic KV bytes, a line per row kind (random
    with its min-max over seeds as error bars). Bytes in the unit that reads best; rows at the same
    bytes are shifted a little apart so none hides another; a single point is a marker, not a line.
    Drawn on a bare `Figure` with the Agg canvas, so pyplot's global state is left alone."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    contexts = sorted({r.context for r in rows})
    kinds = list(dict.fromkeys(row_name(r) for r in rows))
    unit, size = byte_unit(max(r.kv_bytes for r in rows))
    fig = Figure(figsize=(5.5 * len(contexts), 4.4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(contexts), squeeze=False, sharey=True)
    spare = iter(f"C{i}" for i in range(5, 100))
    base = {row_name(r): r.row for r in rows}
    styles = {k: ROWS[base[k]].style if base[k] in ROWS and k == base[k] else (next(spare), "D") for k in kinds}
    for ax, context in zip(axes[0], contexts, strict=True):
        span = max(r.kv_bytes for r in rows if r.context == context) / size
        for n, kind in enumerate(kinds):
            points = sorted((r for r in rows if r.context == context and row_name(r) == kind), key=lambda r: r.kv_bytes)
            if not points:
                continue
            color, marker = styles[kind]
            shift = (n - (len(kinds) - 1) / 2) * 0.012 * span  # rows at the same bytes side by side
            x = [r.kv_bytes / size + shift for r in points]
            y = [r.exact_match for r in points]
            line = "-" if len(points) > 1 else "none"
            if all(r.min is not None for r in points):
                # clamped: the mean of draws can exceed their max by a rounding error (1e-17)
                err = [
                    [max(0.0, r.exact_match - r.min) for r in points],
                    [max(0.0, r.max - r.exact_match) for r in points],
                ]
                ax.errorbar(x, y, yerr=err, color=color, marker=marker, linestyle=line, capsize=3, label=kind)
            else:
                ax.plot(x, y, color=color, marker=marker, linestyle=line, markersize=7, label=kind)
        ax.set_title(f"context {context:,} tokens", fontsize=10)
        ax.set_xlabel(f"KV cache per sequence ({unit})")
        ax.set_xlim(left=0, right=span * 1.08)
        ax.locator_params(axis="x", nbins=5)
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("passkey exact match")
    axes[0][-1].legend(loc="lower right", fontsize=8)
    if title:
        wrapped = textwrap.fill(subtitle, int(12 * 5.5 * len(contexts)), break_long_words=False)
        fig.suptitle(title + (f"\n{wrapped}" if subtitle else ""), fontsize=10)
    fig.tight_layout()
    path = Path(path)
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=110, format=path.suffix.lstrip(".").lower())
    return write_atomic(path, buffer.getvalue())


def task_label(task: str) -> str:
    """'niah_single_2_local' -> 'single_2*' (* = a local haystack), 'ruler_vt' -> 'vt'."""
    short = task.removeprefix("niah_").removeprefix("ruler_")
    return short.removesuffix("_local") + ("*" if short.endswith("_local") else "")


def render_ruler_table(rows, console: Console | None = None, title: str | None = None) -> None:
    """Row x protocol x context -> lm-eval's score per RULER task, their average and KV of full."""
    tasks = list(rows[0].scores) if rows else []
    table = Table(title=title, box=box.SIMPLE_HEAD, caption="* essay tasks on a local haystack (not the PG essays)")
    for name in ("row", "protocol", "context", "sparsity", *map(task_label, tasks), "average", "of full"):
        table.add_column(name, justify="left" if name in ("row", "protocol") else "right", no_wrap=True)
    for row in rows:
        table.add_row(
            row.row,
            row.protocol,
            str(row.context),
            f"{row.sparsity:g}",
            *(f"{row.scores[t]:.2f}" for t in tasks),
            f"{row.average:.3f}",
            f"{row.fraction_of_full:.3f}",
        )
    # piped to a file: wide enough that no column is cut (task names up to 11 characters, 2 of padding)
    wide = Console() if Console().is_terminal else Console(width=60 + 13 * len(tasks))
    (console or wide).print(table)

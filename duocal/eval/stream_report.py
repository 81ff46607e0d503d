"""What `duocal eval stream` shows: a table of buckets by row, and the paper's figure (perplexity against
tokens on a log axis, one line per row, the trained length marked)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from duocal.eval.stream import StreamRow
from duocal.eval.tables import compact_table
from duocal.reports.terminal import table_console
from duocal_runtime.files.atomic import write_atomic
from duocal_runtime.planning.sizes import human_bytes

TABLE_BUCKETS = 12  # at most this many buckets per row in the table (the first, the last, spread between)


def shown_buckets(count: int) -> list[int]:
    if count <= TABLE_BUCKETS:
        return list(range(count))
    step = (count - 1) / (TABLE_BUCKETS - 1)
    return sorted({round(i * step) for i in range(TABLE_BUCKETS)})


def ppl_text(ppl: float) -> str:
    return f"{ppl:.2f}" if ppl < 100 else f"{ppl:,.0f}"


def render_stream_table(rows: Sequence[StreamRow], console: Console | None = None, title: str | None = None) -> None:
    """Per row, a line per shown bucket: tokens, perplexity (fresh where checked), KV bytes, RSS, tokens/s."""
    console = console or table_console()
    table = compact_table(console, title)
    for name in ("row", "tokens to", "ppl", "fresh ppl", "KV bytes", "RSS", "tok/s"):
        table.add_column(name, justify="left" if name == "row" else "right", no_wrap=name != "row")
    for row in rows:
        for n, index in enumerate(shown_buckets(len(row.buckets))):
            b = row.buckets[index]
            fresh = "" if b.fresh_ppl is None else f"{ppl_text(b.fresh_ppl)} ({b.ppl / b.fresh_ppl - 1:+.0%})"
            table.add_row(
                row.name if n == 0 else "",
                f"{b.end:,}",
                ppl_text(b.ppl),
                fresh,
                human_bytes(b.kv_bytes),
                human_bytes(b.rss_bytes),
                f"{b.tokens_per_s:,.0f}",
            )
    console.print(table)
    for row in rows:
        if row.stopped:
            console.print(f"{row.name}: {row.stopped}", highlight=False)


def plot_stream(rows: Sequence[StreamRow], path: str | Path, trained: int | None, title: str = "") -> Path:
    """Perplexity against the tokens streamed (log axes; a point every `resolution` tokens), a line per row,
    the trained length as a dashed line. Drawn on a bare `Figure` (Agg): pyplot's global state is left alone."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    fig = Figure(figsize=(7.5, 4.4))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for row in rows:
        if row.points:
            ends = [end for end, _ in row.points]
            ax.plot(ends, [ppl for _, ppl in row.points], marker="." if len(ends) > 1 else "o", label=row.name)
    if trained:
        ax.axvline(trained, color="grey", linestyle="--", linewidth=1, label=f"trained length ({trained:,})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens streamed")
    ax.set_ylabel("perplexity (since the last point)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=110, format=path.suffix.lstrip(".").lower())
    return write_atomic(path, buffer.getvalue())

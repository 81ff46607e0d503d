"""`duocal tune`'s curve for people: a table in the terminal and a plot (quality against KV memory, one
point per sparsity, full attention as the reference line, the chosen sparsity marked)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from duocal_runtime.files.atomic import write_atomic
from duocal_runtime.planning.sizes import byte_unit, human_bytes

from .terminal import simple_head_box, table_console


def loss_label(record: dict[str, Any]) -> str:
    return "log ppl" if record["data"]["kind"] == "text" else "answer loss"


def render_tune_table(record: dict[str, Any], console: Console | None = None) -> None:
    """The measured table of a `duocal tune` record, the chosen row marked, and the rule."""
    console = console or table_console()
    data, table_rows = record["data"], record["table"]
    full = next(p for p in table_rows if p["sparsity"] == 0)
    table = Table(
        title=f"{escape(record['model'])} on {escape(data['name'])} ({data['items']} items), KV at "
        f"{record['context']} tokens ({record['dtype']})",
        show_edge=False,
        box=simple_head_box(console),
    )
    for name in ("sparsity", "KV bytes", "of full", loss_label(record), "vs full", "exact", "lost", ""):
        table.add_column(name, justify="left" if not name else "right")
    for p in table_rows:
        exact = "" if p["exact"] is None else f"{p['exact']}/{p['total']}"
        lost = "" if p.get("lost") is None else f"{p['lost']}/{full['exact']}"
        mark = "chosen" if p["sparsity"] == record["chosen_sparsity"] else ""
        table.add_row(
            f"{p['sparsity']:g}",
            human_bytes(p["kv_bytes"]),
            f"{p['fraction_of_full']:.2f}",
            finite_text(p["loss"], "{:.4f}"),
            finite_text(None if None in (p["loss"], full["loss"]) else p["loss"] - full["loss"], "{:+.4f}"),
            exact,
            lost,
            mark,
        )
    console.print(table)
    console.print(f"rule: {escape(record['rule']['text'])}")
    console.print(f"chosen sparsity: {record['chosen_sparsity']:g}")


def finite_text(value: float | None, form: str) -> str:
    return "not finite" if value is None else form.format(value)


def plot_tune_curve(record: dict[str, Any], path: str | Path) -> Path:
    """Quality against KV bytes: the loss panel, and an exact-match panel where it was measured."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    points = sorted(record["table"], key=lambda p: p["kv_bytes"])
    full = next(p for p in points if p["sparsity"] == 0)
    chosen = next(p for p in points if p["sparsity"] == record["chosen_sparsity"])
    panels = [("loss", loss_label(record) + " (nats per token, lower is better)")]
    if full["exact"] is not None:
        panels.append(("exact", f"greedy answers exactly right (of {full['total']})"))
        points = [{**p, "kept": full["exact"] - p["lost"]} if p.get("lost") is not None else p for p in points]
    unit, size = byte_unit(full["kv_bytes"])
    fig = Figure(figsize=(5.2 * len(panels), 4.2))
    FigureCanvasAgg(fig)
    for ax, (key, label) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels, strict=True):
        x = [p["kv_bytes"] / size for p in points]
        ax.plot(x, [p[key] for p in points], marker="o", color="tab:blue", label="profile at each sparsity")
        if key == "exact" and all("kept" in p for p in points):  # what the rule judges, prompt by prompt
            kept = [p["kept"] for p in points]
            ax.plot(x, kept, marker="v", color="tab:orange", label="full attention's right answers kept")
        for p in points:
            ax.annotate(f"{p['sparsity']:g}", (p["kv_bytes"] / size, p[key]), textcoords="offset points", xytext=(4, 4))
        ax.axhline(full[key], color="tab:gray", linestyle="--", label="full attention")
        at = ([chosen["kv_bytes"] / size], [chosen[key]])
        ax.plot(
            *at, marker="*", markersize=16, color="tab:red", linestyle="none", label=f"chosen: {chosen['sparsity']:g}"
        )
        ax.set_xlabel(f"KV cache at {record['context']:,} tokens ({unit}, {record['dtype']})")
        ax.set_ylabel(label)
        ax.set_xlim(left=0)
        if key == "exact":  # whole answers, 0 to all of them: a flat curve reads as flat
            ax.set_ylim(-0.5, full["total"] + 0.5)
        ax.legend(fontsize=8)
    fig.suptitle(f"{record['model']} on {Path(record['data']['name']).name}", fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    path = Path(path)
    fig.savefig(buffer, dpi=110, format=path.suffix.lstrip(".").lower())
    return write_atomic(path, buffer.getvalue())

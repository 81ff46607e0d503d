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
    """The tables of a `duocal tune` record (the measuring set's, and the confirming set's where the record has
    one), the chosen row marked, the rule and the margin."""
    console = console or table_console()
    data = record["data"]
    title = (
        f"{escape(record['model'])} on {escape(data['name'])} ({data['items']} items), KV at "
        f"{record['context']} tokens ({record['dtype']})"
    )
    console.print(curve_table(console, record, title, record["table"]))
    confirmation = record.get("confirmation")
    if confirmation and confirmation["table"]:
        name = f"confirmed on {escape(confirmation['data']['name'])} ({confirmation['data']['items']} items)"
        console.print(curve_table(console, record, name, confirmation["table"]))
    console.print(f"rule: {escape(record['rule']['text'])}")
    if "measured_pick" in record:
        console.print(f"the measuring set's pick: {record['measured_pick']:g}")
    console.print(f"chosen sparsity: {record['chosen_sparsity']:g}")
    if record.get("margin"):
        console.print(scored_line(record))
        console.print(margin_line(record))


def curve_table(console: Console, record: dict[str, Any], title: str, rows: list[dict[str, Any]]) -> Table:
    full = next(p for p in rows if p["sparsity"] == 0)
    table = Table(title=title, show_edge=False, box=simple_head_box(console))
    for name in ("sparsity", "KV bytes", "of full", loss_label(record), "vs full", "exact", "lost", ""):
        table.add_column(name, justify="left" if not name else "right")
    for p in rows:
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
    return table


def scored_line(record: dict[str, Any]) -> str:
    """How many prompts each set scored, and how many of them full attention answers right."""
    sets = [("measuring", record["table"]), ("confirming", record["confirmation"]["table"])]
    parts = []
    for name, rows in sets:
        if rows:
            full = next(p for p in rows if p["sparsity"] == 0)
            right = "" if full["exact"] is None else f", full attention right on {full['exact']}"
            parts.append(f"{name} set {full['total']} items{right}")
    return "scored: " + "; ".join(parts)


def margin_line(record: dict[str, Any]) -> str:
    """How far the chosen sparsity stays inside the rule on each set: nats, and answers it may still lose."""
    parts = []
    for name, margin in record["margin"].items():
        if margin is None:
            continue
        nats = "not finite" if margin["loss_nats"] is None else f"{margin['loss_nats']:.4f} nats"
        answers = "" if margin["answers"] is None else f", {margin['answers']} answers"
        parts.append(f"{name} set {nats}{answers}")
    return f"margin at {record['chosen_sparsity']:g}: " + "; ".join(parts)


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

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
    if record.get("scored"):
        console.print(scored_line(record))
    if record.get("margin"):
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
    """How many items each set scored, how many of them full attention answers right, and how many of those a
    sparsity may lose."""
    parts = []
    for name, got in record["scored"].items():
        if got is None:
            continue
        right = (
            ""
            if got["full_right"] is None
            else (f", full attention right on {got['full_right']}, {got['allowed_losses']} of them may be lost")
        )
        parts.append(f"{name} set {got['items']} items{right}")
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
    """What the rule judges, against KV bytes, for each set: the loss over full attention's (the tolerance
    marked), and where exact match was measured, full attention's right answers lost (the most allowed marked)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    sets = [("measuring set", record["table"], "tab:blue", "o")]
    confirmation = record.get("confirmation") or {}
    if confirmation.get("table"):
        sets.append(("confirming set", confirmation["table"], "tab:green", "s"))
    full = next(p for p in record["table"] if p["sparsity"] == 0)
    panels = [("rise", f"{loss_label(record)} over full attention's (nats per token)")]
    if full["exact"] is not None:
        panels.append(("lost", "full attention's right answers lost"))
    unit, size = byte_unit(full["kv_bytes"])
    fig = Figure(figsize=(5.2 * len(panels), 4.2))
    FigureCanvasAgg(fig)
    for ax, (key, label) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels, strict=True):
        for name, rows, color, marker in sets:
            plot_set(ax, record, name, rows, key, color, marker, size)
        if key == "rise":
            ax.axhline(record["rule"]["tolerance_nats"], color="tab:red", linestyle="--", label="tolerance")
        ax.set_xlabel(f"KV cache at {record['context']:,} tokens ({unit}, {record['dtype']})")
        ax.set_ylabel(label)
        ax.set_xlim(left=0)
        ax.legend(fontsize=8)
    fig.suptitle(f"{record['model']} on {Path(record['data']['name']).name}", fontsize=10)
    fig.tight_layout()
    buffer = io.BytesIO()
    path = Path(path)
    fig.savefig(buffer, dpi=110, format=path.suffix.lstrip(".").lower())
    return write_atomic(path, buffer.getvalue())


def plot_set(ax, record: dict[str, Any], name: str, rows: list[dict[str, Any]], key: str, color, marker, size):
    """One set's points on a panel, sparsities annotated, the chosen one starred, its allowed losses dotted."""
    rows = sorted(rows, key=lambda p: p["kv_bytes"])
    full = next(p for p in rows if p["sparsity"] == 0)
    if key == "rise":
        values = [None if None in (p["loss"], full["loss"]) else p["loss"] - full["loss"] for p in rows]
    else:
        values = [p.get("lost") for p in rows]
    shown = [(p, v) for p, v in zip(rows, values, strict=True) if v is not None]
    x = [p["kv_bytes"] / size for p, _ in shown]
    ax.plot(x, [v for _, v in shown], marker=marker, color=color, label=name)
    for p, v in shown:
        ax.annotate(f"{p['sparsity']:g}", (p["kv_bytes"] / size, v), textcoords="offset points", xytext=(4, 4))
        if p["sparsity"] == record["chosen_sparsity"]:
            chosen = f"chosen: {p['sparsity']:g}" if name == "measuring set" else None
            ax.plot(
                [p["kv_bytes"] / size], [v], marker="*", markersize=16, color="tab:red", linestyle="none", label=chosen
            )
    allowed = ((record.get("scored") or {}).get(name.split()[0]) or {}).get("allowed_losses")
    if key == "lost" and allowed is not None:
        ax.axhline(allowed, color=color, linestyle=":", label=f"{name}: most it may lose")

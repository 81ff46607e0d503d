"""Figures of profiles, written as PNG with matplotlib's Agg backend.

No pyplot: a `Figure` is drawn on its own Agg canvas, so nothing global changes (no backend
switch, no open-figure registry) and this works on machines without a display.
"""

from __future__ import annotations

import io
import os
import textwrap
from collections.abc import Sequence
from pathlib import Path

import duocal_runtime as dr
from duocal_runtime.files.atomic import write_atomic

Scores = dr.Profile | Sequence[Sequence[float]]


def _matrix(scores: Scores) -> list[list[float]]:
    rows = scores.scores if isinstance(scores, dr.Profile) else scores
    matrix = [[float(s) for s in row] for row in rows]
    if not matrix or not matrix[0] or len({len(r) for r in matrix}) != 1:
        raise ValueError("a heatmap needs a non-empty rectangular matrix [layers][kv_heads]")
    return matrix


def title_lines(text: str, width: int) -> str:
    """A title that breaks between phrases ("model: what (how)" -> "model:" / "what (how)"), not inside one."""
    lines = []
    for line in text.splitlines():
        parts = [p + ":" for p in line.split(": ")[:-1]] + [line.split(": ")[-1]]
        for part in parts:
            lines += textwrap.wrap(part, width, break_long_words=False) or [""]
    return "\n".join(lines)


def _default_title(scores: Scores) -> str:
    if isinstance(scores, dr.Profile):
        return f"{scores.model.name_or_path or 'profile'}\nscore per (layer, KV head)"
    return "score per (layer, KV head)"


def scores_heatmap(
    profile: Scores,
    path: str | os.PathLike,
    title: str | None = None,
    *,
    vmin: float = 0.0,
    vmax: float = 1.0,
    cmap: str = "viridis",
    label: str = "score",
) -> Path:
    """Write a layers x KV-heads heatmap of `profile`'s scores (or any [layers][heads] matrix) to PNG.

    Rows are layers (0 at the top), columns KV heads; colour from `vmin` to `vmax` (scores and
    DuoAttention gates live in [0, 1]). Written atomically. Returns `path`.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    matrix = _matrix(profile)
    layers, heads = len(matrix), len(matrix[0])
    width = min(max(3.0 + 0.3 * heads, 5.0), 14.0)
    fig = Figure(figsize=(width, min(max(1.5 + 0.18 * layers, 3.0), 14.0)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(matrix, aspect="auto", interpolation="nearest", cmap=cmap, vmin=vmin, vmax=vmax)
    ax.set_xlabel("KV head")
    ax.set_ylabel("layer")
    text = title if title is not None else _default_title(profile)
    ax.set_title(title_lines(text, int(width * 9)), fontsize=9)
    fig.colorbar(image, ax=ax, label=label)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return write_atomic(path, buffer.getvalue())

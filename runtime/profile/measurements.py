"""Named per-head measurements a profile can carry (profile format version 2).

Besides its one score per (layer, KV head), a version-2 profile may hold measurements such as
`retrieval` (attention from answer positions to the needle, Wu et al. 2024, arXiv 2404.15574)
or `kept:sink_window` (the share of a head's attention mass a sink-window policy keeps) or
`error:full-kv4` (the relative error 4-bit KIVI codes add to a head's attention output), each
with the settings it was measured at (policy sizes, context, samples, data) and where it came
from. Values are per (layer, KV head), in [0, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import ProfileError
from .shape import ModelShape

SOURCES = ("profiler", "calibration", "import")
KEPT_PREFIX = "kept:"  # kept:<policy name>: share of attention mass that policy keeps
ERROR_PREFIX = "error:"  # error:<policy label>: relative error of the attention output (e.g. error:full-kv4)


def kept_name(policy_name: str) -> str:
    return KEPT_PREFIX + policy_name


def error_name(policy_label: str) -> str:
    return ERROR_PREFIX + policy_label


@dataclass(frozen=True)
class Measurement:
    scores: tuple[tuple[float, ...], ...]  # [layer][kv_head], each in [0, 1]
    settings: dict[str, Any] = field(default_factory=dict)  # what it was measured at
    source: str = "profiler"

    def __post_init__(self):
        if isinstance(self.scores, (list, tuple)) and all(isinstance(r, (list, tuple)) for r in self.scores):
            object.__setattr__(self, "scores", tuple(tuple(row) for row in self.scores))  # hashable, comparable

    def flat(self) -> list[float]:
        return [s for row in self.scores for s in row]

    def to_dict(self) -> dict[str, Any]:
        return {"scores": [list(row) for row in self.scores], "settings": self.settings, "source": self.source}


def measurement_from_dict(name: str, data: Any, shape: ModelShape) -> Measurement:
    where = f"measurements.{name}"
    if not isinstance(data, dict):
        raise ProfileError(f"{where} must be an object with scores, settings and source")
    unknown = set(data) - {"scores", "settings", "source"}
    if unknown:
        raise ProfileError(f"{where}: unknown field(s) {sorted(unknown)}")
    settings, source = data.get("settings", {}), data.get("source", "profiler")
    if not isinstance(settings, dict):
        raise ProfileError(f"{where}.settings must be an object")
    if source not in SOURCES:
        raise ProfileError(f"{where}.source must be one of {', '.join(SOURCES)}, got {source!r:.40}")
    return Measurement(checked_table(data.get("scores"), shape, f"{where}.scores"), settings, source)


def checked_table(rows: Any, shape: ModelShape, where: str) -> tuple[tuple[float, ...], ...]:
    """A [layers][kv_heads] table of finite numbers in [0, 1], or `ProfileError` naming the cell."""
    want = (shape.num_hidden_layers, shape.num_key_value_heads)
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, (list, tuple)) for r in rows):
        raise ProfileError(f"{where} must be a list of rows (one per layer) of numbers (one per KV head)")
    if len(rows) != want[0] or any(len(r) != want[1] for r in rows):
        raise ProfileError(f"{where} must be {want[0]} layers x {want[1]} KV heads")
    for layer, row in enumerate(rows):
        for head, s in enumerate(row):
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or not 0 <= s <= 1:
                raise ProfileError(f"{where} [{layer}][{head}] is {s!r:.40}; values must be finite numbers in [0, 1]")
    return tuple(tuple(float(s) for s in row) for row in rows)

"""The docs' figures, redrawn from the rows their evaluation saved: `python -m benchmarks.figures FILE.json ...`.

A figure file holds the rows `duocal eval passkey --json` prints (only the fields a plot reads are
needed: row, context, exact_match, kv_bytes; kv_bits, protocol, min, max when present) with the
plot's title and the command that measured them::

    {"title": "...", "subtitle": "...", "command": "duocal eval passkey ...", "rows": [{...}, ...]}

A bare JSON list (the `--json` output itself) is read too. A `duocal tune` curve is a file holding the
record `duocal tune --json` prints under `"tune"` (`{"command": "duocal tune ...", "tune": {...}}`).
The PNG is written beside the file
(`NAME.json` -> `NAME.png`), so a plot's look changes in one place (`tables.plot_rows`) and every
figure follows with one command (`make figures`), without re-running its evaluation.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from duocal.eval.tables import plot_rows
from duocal.reports.tune_report import plot_tune_curve
from duocal_runtime.files.regular_files import read_text

REQUIRED = {"row": str, "context": int, "exact_match": float, "kv_bytes": int}
OPTIONAL = {"kv_bits": int, "protocol": str, "min": float, "max": float}


@dataclass(frozen=True)
class SavedRow:
    """The fields of a saved passkey row that a plot reads."""

    row: str
    context: int
    exact_match: float
    kv_bytes: int
    kv_bits: int = 16
    protocol: str = "query-aware"
    min: float | None = None
    max: float | None = None


def _checked_field(data: dict[str, Any], name: str, kind: type, where: str) -> Any:
    value = data[name]
    number = kind in (int, float) and isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int and number and float(value).is_integer():
        return int(value)
    if kind is float and number and math.isfinite(value):
        return float(value)
    if kind is str and isinstance(value, str) and value:
        return value
    raise ValueError(
        f"{where}: {name} must be {'a non-empty string' if kind is str else f'a finite {kind.__name__}'}, got {value!r}"
    )


def saved_row(data: Any, where: str) -> SavedRow:
    """One row of a figure file, checked: a missing or ill-typed field is an error naming it."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a row must be an object, got {type(data).__name__}")
    missing = sorted(set(REQUIRED) - set(data))
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)} (rows as `duocal eval passkey --json` prints them)")
    fields = {name: _checked_field(data, name, kind, where) for name, kind in REQUIRED.items()}
    fields |= {
        name: _checked_field(data, name, kind, where) for name, kind in OPTIONAL.items() if data.get(name) is not None
    }
    return SavedRow(**fields)


def load_figure(path: Path) -> tuple[list[SavedRow], str | None, str]:
    """The rows, title and subtitle of a figure file; `ValueError` naming the file when it is not one."""
    try:
        data = json.loads(read_text(path, "figure file"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    spec = {"rows": data} if isinstance(data, list) else data
    if not isinstance(spec, dict) or not isinstance(spec.get("rows"), list) or not spec["rows"]:
        raise ValueError(f'{path}: give a non-empty list of rows, or an object with one under "rows"')
    rows = [saved_row(r, f"{path}: row {i}") for i, r in enumerate(spec["rows"])]
    return rows, spec.get("title"), spec.get("subtitle", "")


def draw(path: Path) -> Path:
    """Redraw the figure of `path` (a figure file) into the PNG beside it."""
    record = tune_record_of(path)
    if record is not None:
        return plot_tune_curve(record, path.with_suffix(".png"))
    rows, title, subtitle = load_figure(path)
    return plot_rows(rows, path.with_suffix(".png"), title=title, subtitle=subtitle)


def tune_record_of(path: Path) -> dict[str, Any] | None:
    """The `duocal tune` record a figure file holds under "tune", checked; None for a passkey figure."""
    try:
        data = json.loads(read_text(path, "figure file"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err})") from None
    if not isinstance(data, dict) or "tune" not in data:
        return None
    record = data["tune"]
    points = record.get("table") if isinstance(record, dict) else None
    if not isinstance(points, list) or not any(isinstance(p, dict) and p.get("sparsity") == 0 for p in points):
        raise ValueError(f'{path}: "tune" must be the record `duocal tune --json` prints (its table holds sparsity 0)')
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.figures", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="figure files (NAME.json); each PNG is written beside it")
    args = parser.parse_args(argv)
    try:
        for path in args.files:
            print(draw(path))
    except (ValueError, OSError) as err:
        parser.exit(1, f"error: {err}\n")


if __name__ == "__main__":
    main()

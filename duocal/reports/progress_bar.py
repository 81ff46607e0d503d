"""The progress bar every long duocal command shows: a label, the bar, units done / in all, what the
command adds (losses, ...), elapsed time and ETA."""

from __future__ import annotations


def progress_bar(label: str, *fields: str, **options):
    """A rich `Progress` with those columns; `label` and `fields` are rich text-column formats
    ('{task.description}', '{task.fields[losses]}'); `options` go to `Progress` (console, disable, ...)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), *map(TextColumn, fields))
    return Progress(*columns, TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), **options)

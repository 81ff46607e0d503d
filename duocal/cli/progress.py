"""Progress on stderr for long commands: rich bars that never touch stdout (so `--json` stays clean)."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def eval_progress(label: str):
    """A transient bar on stderr; yields the `progress(done, total, label)` callback evaluations take."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=None)
        yield lambda done, total, what: bar.update(task, completed=done, total=total, description=what)

"""Progress on stderr for long commands: rich bars that never touch stdout (so `--json` stays clean)."""

from __future__ import annotations

import contextlib

from duocal.reports.progress_bar import progress_bar


class EvalProgress:
    """What evaluations report to: `progress(done, total, what)` moves the bar, `progress.row(text)`
    prints a finished row above it (on stderr, so results are seen as they come)."""

    def __init__(self, bar, task):
        self.bar, self.task = bar, task

    def __call__(self, done: int, total: int, what: str) -> None:
        self.bar.update(self.task, completed=done, total=total, description=what)

    def row(self, text: str) -> None:
        self.bar.console.print(text, highlight=False)


@contextlib.contextmanager
def eval_progress(label: str):
    """A bar on stderr with units done / in all, elapsed time and ETA; yields an `EvalProgress`."""
    from rich.console import Console

    with progress_bar("{task.description}", console=Console(stderr=True), transient=True) as bar:
        yield EvalProgress(bar, bar.add_task(label, total=None))

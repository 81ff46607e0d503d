"""Progress on stderr for long commands (stdout stays clean for `--json`).

On a terminal: a rich bar (units done / in all, elapsed, ETA). Anywhere else (a pipe, a log file,
CI): plain lines every `LINE_SECONDS` (also while one long batch runs) and at the end, "passkey:
16/48 (33%), 1:02 elapsed, ETA 2:04, duo @ sparsity 0.5, 2048 tokens", because a bar redrawn into a
file is unreadable.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable

from duocal.reports.progress_bar import progress_bar

LINE_SECONDS = 15.0  # a plain line at most this often (and at the last unit)


def clock_text(seconds: float) -> str:
    """'1:02:03' or '2:04': whole seconds, as rich shows elapsed time."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def progress_line(label: str, done: int, total: int, elapsed: float, what: str) -> str:
    """One plain progress line; the ETA is the elapsed time per unit times the units left."""
    share = f" ({done / total:.0%})" if total else ""
    eta = f", ETA {clock_text(elapsed / done * (total - done))}" if 0 < done < total else ""
    tail = f", {what}" if what and what != label else ""
    return f"{label}: {done}/{total}{share}, {clock_text(elapsed)} elapsed{eta}{tail}"


class LineProgress:
    """`progress(done, total, what)` for a non-terminal: a line at the start, when the first units are
    done (the first ETA), when `every` seconds have passed since the last line, when the work changes,
    and at the end; `progress.row(text)` prints a finished row."""

    def __init__(self, label: str, write: Callable[[str], None], every: float = LINE_SECONDS, clock=time.monotonic):
        self.label, self.write, self.every, self.clock = label, write, every, clock
        self.started = clock()
        self.last: tuple[float, str, int] | None = None  # the last line's time, work and units done
        self.state: tuple[int, int, str] | None = None  # the last report
        self.lock = threading.Lock()  # `beat` runs on a timer thread

    def __call__(self, done: int, total: int, what: str) -> None:
        with self.lock:
            now, last = self.clock(), self.last
            self.state = (done, total, what)
            due = last is None or now - last[0] >= self.every or what != last[1] or done >= total
            if (due or last[2] == 0 < done) and total:
                self._line(now)

    def beat(self) -> None:
        """The last report again when no line came for `every` seconds (a long batch is still running)."""
        with self.lock:
            now = self.clock()
            if self.state is not None and self.state[1] and (self.last is None or now - self.last[0] >= self.every):
                self._line(now)

    def _line(self, now: float) -> None:
        done, total, what = self.state
        self.write(progress_line(self.label, done, total, now - self.started, what))
        self.last = (now, what, done)

    @contextlib.contextmanager
    def beating(self):
        """`beat` every `every` seconds on a daemon thread while the block runs."""
        stop = threading.Event()

        def beat_until_stopped() -> None:
            while not stop.wait(self.every):
                self.beat()

        thread = threading.Thread(target=beat_until_stopped, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()

    def row(self, text: str) -> None:
        self.write(text)


class EvalProgress:
    """What evaluations report to on a terminal: `progress(done, total, what)` moves the bar,
    `progress.row(text)` prints a finished row above it."""

    def __init__(self, bar, task):
        self.bar, self.task = bar, task

    def __call__(self, done: int, total: int, what: str) -> None:
        self.bar.update(self.task, completed=done, total=total, description=what)

    def row(self, text: str) -> None:
        self.bar.console.print(text, highlight=False)


def stderr_line(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def stderr_progress(label: str):
    """Progress of `label` on stderr: a bar on a terminal, else plain periodic lines (`LineProgress`)."""
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        with LineProgress(label, stderr_line).beating() as progress:
            yield progress
        return
    with progress_bar("{task.description}", console=console, transient=True) as bar:
        yield EvalProgress(bar, bar.add_task(label, total=None))

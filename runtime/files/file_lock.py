"""Exclusive locks on the folders duocal writes, so that two writers never mix their files.

`exclusive(folder)` takes an advisory lock (`fcntl.flock`) on `folder/.duocal.lock` for as long as
the block runs: a second writer of an output folder is refused at once with the first one's pid,
and a second writer of a cache waits (`wait=True`) and then finds the first one's result there.
The lock goes with the process (a killed writer leaves no stale lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

LOCK_NAME = ".duocal.lock"


class FolderBusyError(OSError):
    """Another process is writing into the folder (an OSError, so commands report it as one line)."""


@contextlib.contextmanager
def exclusive(folder: str | os.PathLike, what: str, wait: bool = False, timeout: float = 3600.0):
    """Hold the lock of `folder` (made if missing) while the block runs; refuse, or wait, when taken."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    handle = open(folder / LOCK_NAME, "a+")
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not wait or time.monotonic() > deadline:
                    handle.seek(0)
                    holder = handle.read().strip() or "another process"
                    raise FolderBusyError(
                        f"{folder} is in use by {holder} ({what}); wait for it to finish, or choose another folder"
                    ) from None
                time.sleep(0.2)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        yield folder
    finally:
        handle.close()  # releases the lock

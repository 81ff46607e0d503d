"""Files duocal reads: regular files only, checked before any work (a fifo would block a read
forever, a device would stream without end), with errors that name the file and what is wrong."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .atomic import KINDS


def file_mode(path: Path, what: str) -> int:
    """`path`'s mode (following links), or ValueError naming `what`: it does not exist, or cannot be read."""
    try:
        return path.stat().st_mode
    except FileNotFoundError:
        raise ValueError(f"{what} {path} does not exist") from None
    except OSError as err:
        raise ValueError(f"cannot read {what} {path}: {err.strerror or err}") from None


def check_regular(path: str | os.PathLike, what: str) -> Path:
    """`path` if it is a regular file (or a link to one), else ValueError naming `what` and the path."""
    path = Path(path)
    mode = file_mode(path, what)
    if stat.S_ISDIR(mode):
        raise ValueError(f"{what} {path} is a folder; give a file")
    for test, kind in KINDS.items():
        if test(mode):
            raise ValueError(f"{what} {path} is {kind}, not a regular file; give a file")
    return path


def read_text(path: str | os.PathLike, what: str) -> str:
    """The UTF-8 text of a regular file, or ValueError naming `what`, the path and the cause."""
    path = check_regular(path, what)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what} {path} is not UTF-8 text (a binary file?)") from None
    except OSError as err:
        raise ValueError(f"cannot read {what} {path}: {err.strerror or err}") from None

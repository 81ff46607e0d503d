"""Atomic writes: a reader sees the old file (or folder) or the new one, never half of one.

New files get the mode a plain `open()` would give them under the user's umask (mkstemp's
0600 would otherwise survive the rename).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path


def umask_mode(directory: bool = False) -> int:
    mask = os.umask(0)
    os.umask(mask)
    return (0o777 if directory else 0o666) & ~mask


def write_atomic(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write `data` to `path` through a temporary file in the same folder and a rename."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder; give a file name", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, umask_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_files_atomic(folder: str | os.PathLike, files: Mapping[str, bytes | str]) -> Path:
    """Write `files` (name -> content) into `folder` all or nothing: they are assembled in a
    temporary folder beside it, which then replaces the files of those names together. Other
    files already in `folder` stay; if anything fails, `folder` is as it was."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{folder} exists and is not a folder")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    try:
        for name, data in files.items():
            write_atomic(staging / name, data)
            target = folder / name
            if target.is_dir() and not target.is_symlink():
                raise IsADirectoryError(f"{target} is a folder; cannot replace it with a file")
        if not folder.exists():
            staging.chmod(umask_mode(directory=True))
            os.replace(staging, folder)
            return folder
        for name in files:
            os.replace(staging / name, folder / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder

"""Atomic writes: a reader sees the old file (or folder) or the new one, never half of one.

New files get the mode a plain `open()` would give them under the user's umask (mkstemp's
0600 would otherwise survive the rename); a file that is replaced keeps its mode (0600 stays 0600).
Only regular files are written: a symlink's target is replaced (the link stays), and a device, fifo
or socket at the path is refused, never replaced.
Commands check their outputs before any work with `output_paths.check_output` / `check_output_folder`.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path


def umask_mode(directory: bool = False) -> int:
    mask = os.umask(0)
    os.umask(mask)
    return (0o777 if directory else 0o666) & ~mask


def kept_mode(target: Path) -> int:
    """The mode a write to `target` leaves: the mode of the file it replaces, else the umask's."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        return umask_mode()


KINDS = {
    stat.S_ISCHR: "a character device",
    stat.S_ISBLK: "a block device",
    stat.S_ISFIFO: "a fifo",
    stat.S_ISSOCK: "a socket",
}


def node_kind(path: Path) -> str | None:
    """What is at `path` (a symlink followed) when a write there would not be a regular file's:
    'a folder', 'a fifo', 'a socket', 'a character device', 'a block device'; None for a regular
    file or nothing at all."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    return next((kind for test, kind in KINDS.items() if test(mode)), None)


def output_target(path: str | os.PathLike) -> Path:
    """Where a write to `path` lands: `path`, or the file a symlink points to (the link stays). Refuses
    what is not, or would not be, a regular file: a folder, a device, a fifo, a socket (writing there
    through a rename would replace the node itself)."""
    path = Path(path)
    target = path.resolve() if path.is_symlink() else path
    kind = node_kind(target)
    if kind == "a folder":
        raise IsADirectoryError(errno.EISDIR, "is a folder; give a file name", str(path))
    if kind is not None:
        raise ValueError(f"{path} is {kind}, not a regular file: duocal writes regular files only; give a file path")
    return target


def write_atomic(path: str | os.PathLike, data: bytes | str, mode: int | None = None) -> Path:
    """Write `data` to `path` through a temporary file in the same folder and a rename (a symlink's
    target is replaced, the link kept; a replaced file's mode is kept unless `mode` says). Returns `path`."""
    path = Path(path)
    target = output_target(path)
    mode = kept_mode(target) if mode is None else mode
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=".duocal-", suffix=".tmp", dir=target.parent)  # short: any valid name fits
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
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
    staging = Path(tempfile.mkdtemp(prefix=".duocal-", suffix=".tmp", dir=folder.parent))
    try:
        for name, data in files.items():
            target = folder / name
            write_atomic(staging / name, data, kept_mode(target))
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

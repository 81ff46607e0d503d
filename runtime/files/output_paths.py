"""Outputs duocal writes, checked before any work: a path that cannot be written is refused in
milliseconds, not after the model has loaded and the work has run.

An output may be missing, and so may folders above it (they are made); what is already there must
be what will be written (a regular file or a link to one; a folder for a folder output), and the
nearest folder that exists must be one this user can write in. Each refusal is a `ValueError` that
names the option, the path and what to do. Writing itself is `atomic.write_atomic`'s.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .atomic import node_kind


def check_output(path: str | os.PathLike, what: str, suffixes: Sequence[str] = ()) -> Path:
    """Everything a later `write_atomic(path)` needs: a regular file, a symlink to one, or nothing,
    in a folder that exists or can be made and that this user may write in (and, given `suffixes`,
    a name ending in one of them). Returns where the write lands (a symlink's target)."""
    path = Path(path)
    target = _target(path, what)
    kind = _kind(target, what, path)
    shown = str(path) if target == path else f"{path} (a link to {target})"
    if kind == "a folder":
        raise ValueError(f"{what} {shown} is a folder; give the path of a file to write (inside it or elsewhere)")
    if kind is not None:
        raise ValueError(
            f"{what} {shown} is {kind}, not a regular file: duocal writes regular files only; give a file path"
        )
    if suffixes and path.suffix.lower() not in suffixes:
        raise ValueError(f"{what} {path}: give a file name ending in {', '.join(suffixes)}")
    _check_writable(target.parent, what, path)
    return target


def check_output_folder(path: str | os.PathLike, what: str, beside: bool = False) -> Path:
    """An output folder: a folder (or a link to one) or nothing, where this user may write; with
    `beside`, also its parent, where `write_files_atomic` assembles it before moving it in."""
    path = Path(path)
    kind = _kind(_target(path, what), what, path)
    if kind != "a folder" and (kind is not None or path.exists() or path.is_symlink()):
        described = kind or _in_words(path)  # None: a regular file, or a link to nothing
        raise ValueError(f"{what} {path} is {described}, not a folder; give a folder path (it is made if missing)")
    _check_writable(path, what, path)
    if beside:
        _check_writable(path.absolute().parent, what, path)
    return path


def _target(path: Path, what: str) -> Path:
    try:
        return path.resolve() if path.is_symlink() else path
    except (OSError, RuntimeError) as err:  # a name too long, a symlink loop (RuntimeError before Python 3.13)
        reason = _reason(err) if isinstance(err, OSError) else str(err)
        raise ValueError(f"{what} {path} cannot be used: {reason}; give another path") from None


def _kind(target: Path, what: str, path: Path) -> str | None:
    """`node_kind`, with a path under a file counted as missing (the folder check names that file)."""
    try:
        return node_kind(target)
    except NotADirectoryError:
        return None
    except OSError as err:  # no search permission above it, a name too long, ...
        raise ValueError(f"{what} {path} cannot be used: {_reason(err)}; give another path") from None


def _check_writable(folder: Path, what: str, path: Path) -> None:
    """The nearest folder of `folder` and its parents that exists is a folder this user can write in."""
    existing = next((p for p in (folder, *folder.parents) if p.exists() or p.is_symlink()), Path("."))
    if not existing.is_dir():
        raise ValueError(f"{what} {path}: {existing} is {_in_words(existing)}, not a folder; give a path in a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"{what} {path}: cannot write in {existing} (permission denied); give a path in a folder you can write to"
        )


def _in_words(existing: Path) -> str:
    """What a path that exists and is no folder is, in words."""
    if existing.is_file():
        return "a file"
    try:
        return node_kind(existing) or "a broken link"
    except OSError as err:
        return f"unusable ({_reason(err)})"


def _reason(err: OSError) -> str:
    text = err.strerror or str(err)
    return text[:1].lower() + text[1:]

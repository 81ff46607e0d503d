"""`load_profile`: a profile from a path, a prebuilt name, a URL or an `hf://` reference."""

from __future__ import annotations

import os
from pathlib import Path

from ..checks import require_reference
from ..errors import ProfileError
from ..profile.format import Profile, read_profile_file
from ..profile.upstream import TSV_NAME, import_upstream
from .pull import pull


def load_profile(
    ref: str | os.PathLike | Profile,
    *,
    offline: bool | None = None,
    force: bool = False,
    mirror: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> Profile:
    """Load a profile from a JSON file or an upstream DuoAttention pattern directory, or pull one.

    A `Path`, or a string naming an existing file or folder, is read directly. Any other string
    is resolved like `duocal profiles pull`: a prebuilt name from the index, an http(s) URL, or
    `hf://OWNER/REPO[/PATH][@REVISION]`, fetched into the cache (see `profile_cache.pull` for
    `offline`, `force`, `mirror` and `cache_dir`). Downloading happens here, in the loader,
    never in model-side objects.
    """
    if isinstance(ref, Profile):
        return ref
    require_reference("ref", ref)
    if isinstance(ref, os.PathLike) or Path(ref).exists():
        return _load_path(Path(ref))
    return pull(ref, offline=offline, force=force, mirror=mirror, cache_dir=cache_dir).profile


def _load_path(path: Path) -> Profile:
    if path.is_dir():
        if (path / "profile.json").is_file():
            return read_profile_file(path / "profile.json")
        if (path / TSV_NAME).is_file():
            return import_upstream(path)
        raise ProfileError(f"{path} holds neither profile.json nor an upstream {TSV_NAME}")
    if path.is_file():
        return read_profile_file(path)
    raise ProfileError(f"no profile at {str(path)!r}: give a path to a profile JSON file or pattern directory")

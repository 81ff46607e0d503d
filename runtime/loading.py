"""`load_profile`: a profile from a path (and, with the prebuilt index, from a name or URL)."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ProfileError
from .profile import Profile, read_profile_file
from .upstream import TSV_NAME, import_upstream


def load_profile(ref: str | os.PathLike | Profile) -> Profile:
    """Load a profile from a JSON file or an upstream DuoAttention pattern directory."""
    if isinstance(ref, Profile):
        return ref
    path = Path(ref)
    if path.is_dir():
        if (path / "profile.json").is_file():
            return read_profile_file(path / "profile.json")
        if (path / TSV_NAME).is_file():
            return import_upstream(path)
        raise ProfileError(f"{path} holds neither profile.json nor an upstream {TSV_NAME}")
    if path.is_file():
        return read_profile_file(path)
    raise ProfileError(f"no profile at {ref!r}: give a path to a profile JSON file or pattern directory")

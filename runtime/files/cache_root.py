"""duocal's cache folder on this machine: fetched profiles, models, built kernels live below it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

CACHE_ENV = "DUOCAL_CACHE_DIR"


def default_cache_dir() -> Path:
    """DUOCAL_CACHE_DIR, else the platform's per-user cache folder + `duocal` (refused when it is a file)."""
    root = _platform_cache_dir()
    if root.exists() and not root.is_dir():
        where = f"{CACHE_ENV}={os.environ[CACHE_ENV]}" if os.environ.get(CACHE_ENV) else "duocal's cache folder"
        raise ValueError(f"{where}: {root} is a file, not a folder; point {CACHE_ENV} at a folder")
    return root


def _platform_cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local") / "duocal" / "cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "duocal"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "duocal"

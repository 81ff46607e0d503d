"""The index of prebuilt profiles, and what a profile reference (`name`, URL, `hf://`, path) means.

The index is `profiles/index.json`, installed as package data of `duocal_runtime.prebuilt`
(this module cannot be called `prebuilt`: that name is the data package). `DUOCAL_INDEX=PATH`
replaces it (a private index, or a test's). Format::

    {"format": "duocal.index", "version": 1, "profiles": [
      {"name": "duo-attention/Meta-Llama-3.1-8B-Instruct",
       "model": "meta-llama/Meta-Llama-3.1-8B-Instruct",
       "format": "upstream-duo-attention",            # or "duocal"
       "origin": "mit-han-lab/duo-attention", "revision": "<40-hex commit>",
       "description": "...",
       "shape": {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128},
       "files": [{"name": "full_attention_heads.tsv", "url": "https://.../<commit>/...", "sha256": "...", "size": 6400},
                 {"name": "config.json", ...}]}]}

Every file has a sha256 and size and a `url` pinned to an immutable revision (`https://...` with the
40-hex commit in its path, or `hf://OWNER/REPO/PATH@<commit>`), a `file` shipped in the profiles folder
(relative path), or both: a shipped copy, read without network, of the file at that url. A `duocal` entry
has one file named `profile.json`; an `upstream-duo-attention` entry has `full_attention_heads.tsv` and
`config.json`.

Resolving a reference, first match wins: `hf://...` -> Hub; `http(s)://` or `file://` -> URL;
an existing file or folder -> path (unchanged behaviour); otherwise a name in the index.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import ProfileError
from ..files.strict_json import loads_strict
from ..profile.shape import SHAPE_FIELDS, ModelShape
from .formats import DUOCAL, FORMAT_FILES, format_of, upstream_files
from .hub import SCHEME as HF_SCHEME
from .hub import HubRef, parse_hf_ref

INDEX_FORMAT, INDEX_VERSION = "duocal.index", 1
INDEX_ENV = "DUOCAL_INDEX"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT_IN_PATH = re.compile(r"/[0-9a-f]{40}(/|$)")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/+-]*$")
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


@dataclass(frozen=True)
class IndexFile:
    """One file of a prebuilt profile: where it comes from and what it must hash to."""

    name: str
    sha256: str
    size: int
    url: str | None = None
    local: Path | None = None  # a shipped file, resolved against the profiles folder


@dataclass(frozen=True)
class IndexEntry:
    name: str
    model: str
    format: str
    shape: ModelShape
    files: tuple[IndexFile, ...]
    origin: str = ""
    revision: str | None = None
    description: str = ""

    @property
    def shipped(self) -> bool:
        """Every file ships with duocal: it loads without network."""
        return all(f.local is not None for f in self.files)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def expected_sha256(self) -> dict[str, str]:
        return {f.name: f.sha256 for f in self.files}


@dataclass(frozen=True)
class UrlSource:
    """A profile JSON or an upstream TSV (with config.json beside it) at an HTTP(S) or file URL."""

    url: str

    @property
    def format(self) -> str:
        return format_of(urlsplit(self.url).path)

    def files(self) -> dict[str, str]:
        if self.format == DUOCAL:
            return {"profile.json": self.url}
        return upstream_files(self.url, self.url.rsplit("/", 1)[0])


@dataclass(frozen=True)
class PathSource:
    path: Path


Source = IndexEntry | UrlSource | HubRef | PathSource


@dataclass(frozen=True)
class PrebuiltIndex:
    entries: tuple[IndexEntry, ...]
    path: Path | None = None

    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def get(self, name: str) -> IndexEntry:
        """The entry called `name` (exact, else the only case-insensitive match)."""
        by_name = {e.name: e for e in self.entries}
        if name in by_name:
            return by_name[name]
        folded = [e for e in self.entries if e.name.lower() == name.lower()]
        if len(folded) == 1:
            return folded[0]
        close = difflib.get_close_matches(name, by_name, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ProfileError(
            f"no profile at {name!r}: not a file or folder, and not a prebuilt profile name.{hint} "
            "Give a path, a name from `duocal profiles list`, an https:// URL or hf://OWNER/REPO."
        )


def default_index_path() -> Path:
    """DUOCAL_INDEX if set, else the index shipped in the `duocal_runtime.prebuilt` package."""
    override = os.environ.get(INDEX_ENV)
    if override:
        return Path(override)
    return Path(str(resources.files("duocal_runtime.prebuilt").joinpath("index.json")))


def load_index(path: str | os.PathLike | None = None) -> PrebuiltIndex:
    """Read and validate an index file; `file` entries resolve against its folder."""
    path = Path(path) if path is not None else default_index_path()
    try:
        data = loads_strict(path.read_bytes(), f"prebuilt index {path}")
    except FileNotFoundError:
        raise ProfileError(f"prebuilt index {path} does not exist (DUOCAL_INDEX?)") from None
    try:
        return index_from_dict(data, path.parent, path)
    except ProfileError as err:
        raise ProfileError(f"prebuilt index {path}: {err}") from None


def index_from_dict(data: Any, root: Path, path: Path | None = None) -> PrebuiltIndex:
    if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT or data.get("version") != INDEX_VERSION:
        raise ProfileError(f'expected an object with "format": "{INDEX_FORMAT}", "version": {INDEX_VERSION}')
    items = data.get("profiles")
    if not isinstance(items, list):
        raise ProfileError('"profiles" must be a list of entries')
    entries = tuple(_entry(item, root) for item in items)
    seen: set[str] = set()
    for entry in entries:
        if entry.name.lower() in seen:
            raise ProfileError(f"duplicate profile name {entry.name!r} (names are unique, ignoring case)")
        seen.add(entry.name.lower())
    return PrebuiltIndex(entries, path)


def _field(item: dict, key: str, kind: type, where: str):
    value = item.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) or value == "":
        raise ProfileError(f"{where}: field {key!r} must be a non-empty {kind.__name__}, got {value!r}")
    return value


def _entry(item: Any, root: Path) -> IndexEntry:
    if not isinstance(item, dict):
        raise ProfileError(f"every entry must be an object, got {item!r}")
    name = _field(item, "name", str, "entry")
    where = f"entry {name!r}"
    if not _NAME.match(name) or "://" in name:
        raise ProfileError(f"{where}: a name is letters, digits and ._/+- (no URL scheme)")
    fmt = _field(item, "format", str, where)
    if fmt not in FORMAT_FILES:
        raise ProfileError(f"{where}: format must be one of {', '.join(FORMAT_FILES)}, got {fmt!r}")
    shape = _field(item, "shape", dict, where)
    missing = [k for k in SHAPE_FIELDS if k not in shape]
    if missing or set(shape) - set(SHAPE_FIELDS):
        raise ProfileError(f"{where}: shape needs exactly {', '.join(SHAPE_FIELDS)}")
    revision = item.get("revision")
    files = tuple(_file(f, root, f"{where}", revision) for f in _field(item, "files", list, where))
    names = sorted(f.name for f in files)
    if names != sorted(FORMAT_FILES[fmt]):
        raise ProfileError(f"{where}: a {fmt} entry has files {list(FORMAT_FILES[fmt])}, got {names}")
    return IndexEntry(
        name,
        _field(item, "model", str, where),
        fmt,
        ModelShape(**{k: shape[k] for k in SHAPE_FIELDS}),
        files,
        str(item.get("origin") or ""),
        revision,
        str(item.get("description") or ""),
    )


def _file(item: Any, root: Path, where: str, revision: str | None) -> IndexFile:
    if not isinstance(item, dict):
        raise ProfileError(f"{where}: every file must be an object, got {item!r}")
    name = _field(item, "name", str, where)
    where = f"{where}, file {name!r}"
    sha = _field(item, "sha256", str, where).lower()
    if not _SHA256.match(sha):
        raise ProfileError(f"{where}: sha256 must be 64 hex digits, got {sha!r}")
    size = _field(item, "size", int, where)
    url, local = item.get("url"), item.get("file")
    if url is None and local is None:
        raise ProfileError(f"{where}: give 'url' (downloaded), 'file' (shipped) or both (shipped, from that url)")
    if url is not None:
        _check_pinned(url, where, revision)
    if local is None:
        return IndexFile(name, sha, size, url=url)
    rel = Path(local)
    if rel.is_absolute() or ".." in rel.parts:
        raise ProfileError(f"{where}: 'file' must be a path inside the profiles folder, got {local!r}")
    return IndexFile(name, sha, size, url=url, local=root / rel)


def _check_pinned(url: str, where: str, revision: str | None) -> None:
    """A URL must name an immutable revision: a 40-hex commit, never a branch such as main."""
    if url.startswith(HF_SCHEME):
        ref = parse_hf_ref(url)
        if not ref.pinned:
            raise ProfileError(f"{where}: {url} must end in @<40-hex commit>, not a branch or tag")
        return
    if urlsplit(url).scheme not in ("http", "https") or not _COMMIT_IN_PATH.search(urlsplit(url).path):
        raise ProfileError(f"{where}: {url} must be an https URL with a 40-hex commit in its path (pinned)")
    if revision is not None and f"/{revision}/" not in urlsplit(url).path + "/":
        raise ProfileError(f"{where}: {url} is not at the entry's revision {revision}")


def resolve(ref: str | os.PathLike, index: PrebuiltIndex | None = None) -> Source:
    """What `ref` names (see the module docstring for the order)."""
    if isinstance(ref, os.PathLike):
        return PathSource(Path(ref))
    if ref.startswith(HF_SCHEME):
        return parse_hf_ref(ref)
    if _URL.match(ref):
        if urlsplit(ref).scheme not in ("http", "https", "file"):
            raise ProfileError(f"cannot pull {ref!r}: use an http(s):// or file:// URL, or hf://OWNER/REPO")
        return UrlSource(ref)
    if Path(ref).exists():
        return PathSource(Path(ref))
    return (index or load_index()).get(ref)

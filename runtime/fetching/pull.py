"""The local cache of pulled profiles, and `pull`: resolve a reference, fetch, verify, convert, cache.

Layout under the cache root (`DUOCAL_CACHE_DIR`, else the user's cache folder + `duocal`)::

    profiles/<kind>/<label>-<digest>/raw/<file>      the files as downloaded
    profiles/<kind>/<label>-<digest>/profile.json    the duocal profile (converted if upstream)
    profiles/<kind>/<label>-<digest>/origin.json     the reference, and sha256 of every file above

Why this is safe without locks: every file is written through a temporary file and a rename,
origin.json last, and for one reference the bytes are always the same (files are verified
against pinned sha256s and conversion is deterministic), so two pulls at once write identical
files and a reader sees a whole file, old or new. A cached entry is used only if every file
still hashes to what origin.json (and the index) says; anything else is fetched again, so a
file corrupted on disk heals on the next pull. Nothing is written until a download is verified.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from ..checks import require_reference
from ..errors import ProfileError
from ..files.cache_root import CACHE_ENV, default_cache_dir
from ..files.strict_json import loads_strict
from ..profile.format import Profile, profile_from_dict, profile_to_json, read_profile_file
from ..profile.upstream import import_upstream
from .download import DownloadSettings, env_mirror, fetch, mirror_url, sha256_hex, verify
from .hub import HubRef, env_offline, hub_download, parse_hf_ref
from .prebuilt_index import IndexEntry, IndexFile, PathSource, PrebuiltIndex, UrlSource, resolve
from .profile_cache import ProfileCache


@dataclass(frozen=True)
class PulledProfile:
    """A profile ready to load. `origin`: shipped, local, cache, download or hub."""

    path: Path
    profile: Profile
    ref: str
    origin: str
    note: str | None = None  # e.g. why a cached copy was replaced


def pull(
    ref: str | os.PathLike,
    *,
    offline: bool | None = None,
    force: bool = False,
    mirror: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    settings: DownloadSettings | None = None,
    index: PrebuiltIndex | None = None,
) -> PulledProfile:
    """Resolve `ref` (name, URL, hf://, path), fetch and verify what is missing, return the cached profile.

    `offline` defaults to HF_HUB_OFFLINE; `mirror` to DUOCAL_MIRROR; `cache_dir` to DUOCAL_CACHE_DIR.
    """
    require_reference("ref", ref)
    offline = env_offline() if offline is None else offline
    if offline and force:
        raise ProfileError("--force re-downloads, which offline mode forbids: drop one of them")
    try:
        cache = ProfileCache(Path(cache_dir) if cache_dir is not None else default_cache_dir())
    except ValueError as error:
        raise ProfileError(f"cannot write the profile cache: {error}") from None
    puller = _Puller(cache, offline, force, mirror or env_mirror(), settings or DownloadSettings.from_env())
    source = resolve(ref, index)
    if isinstance(source, IndexEntry):
        return puller.entry(source)
    if isinstance(source, HubRef):
        return puller.hub(source)
    if isinstance(source, UrlSource):
        return puller.url(source)
    return _local(source)


def _local(source: PathSource) -> PulledProfile:
    if source.path.is_dir():
        raise ProfileError(
            f"{source.path} is a folder: load it directly, or convert it with "
            f"`duocal profiles import-upstream {source.path} -o OUT.json`"
        )
    return PulledProfile(source.path, read_profile_file(source.path), str(source.path), "local")


def _convert(fmt: str, raw: dict[str, bytes], label: str, commit: str | None) -> tuple[Profile, bytes]:
    """(profile, bytes of profile.json). A duocal file is kept byte for byte (its sha256 is pinned)."""
    try:
        if fmt == "duocal":
            return profile_from_dict(loads_strict(raw["profile.json"], f"{label}: profile.json")), raw["profile.json"]
        with tempfile.TemporaryDirectory(prefix="duocal-pull-") as tmp:
            for name, data in raw.items():
                Path(tmp, name).write_bytes(data)
            profile = import_upstream(tmp, commit=commit)
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError and ProfileError are ValueErrors
        raise ProfileError(f"{label} is not a valid {fmt} profile: {err}. Nothing was cached.") from None
    files = {name: sha256_hex(data) for name, data in sorted(raw.items())}
    profile = replace(profile, source={**profile.source, "pulled_from": label, "files_sha256": files})
    return profile, profile_to_json(profile).encode()


@dataclass(frozen=True)
class _Puller:
    cache: ProfileCache
    offline: bool
    force: bool
    mirror: str | None
    settings: DownloadSettings

    def entry(self, entry: IndexEntry) -> PulledProfile:
        if entry.shipped and entry.format == "duocal":
            return self._shipped(entry, entry.files[0])
        folder = self.cache.folder("index", entry.name)
        hit, note = self._cached(folder, entry.expected_sha256(), entry.name)
        if hit:
            return hit
        self._require_network(entry.name, entry.shipped)
        raw = {f.name: self._read(f) for f in entry.files}
        profile, data = _convert(entry.format, raw, entry.name, entry.revision)
        if profile.shape != entry.shape:
            raise ProfileError(
                f"{entry.name}: the index says {entry.shape.describe()} but the files hold "
                f"{profile.shape.describe()}; the index entry is wrong. Nothing was cached."
            )
        path = self.cache.store(folder, entry.name, raw, data)
        return PulledProfile(path, profile, entry.name, "shipped" if entry.shipped else "download", note)

    def url(self, source: UrlSource) -> PulledProfile:
        folder = self.cache.folder("url", source.url)
        hit, note = self._cached(folder, None, source.url)
        if hit:
            return hit
        self._require_network(source.url)
        # A URL the user typed is fetched as given: the mirror rewrites index URLs only.
        raw = {n: fetch(u, settings=self.settings) for n, u in source.files().items()}
        profile, data = _convert(source.format, raw, source.url, None)
        return PulledProfile(self.cache.store(folder, source.url, raw, data), profile, source.url, "download", note)

    def hub(self, ref: HubRef) -> PulledProfile:
        """Always through huggingface_hub, whose cache and HF_HUB_OFFLINE decide what is fetched."""
        paths = {n: hub_download(ref, p, offline=self.offline, force=self.force) for n, p in ref.files().items()}
        raw = {name: path.read_bytes() for name, path in paths.items()}
        profile, data = _convert(ref.format, raw, str(ref), ref.revision if ref.pinned else None)
        path = self.cache.store(self.cache.folder("hub", str(ref)), str(ref), raw, data)
        return PulledProfile(path, profile, str(ref), "hub")

    def _cached(self, folder: Path, expected, label: str) -> tuple[PulledProfile | None, str | None]:
        if self.force:
            return None, None
        path, problem = self.cache.lookup(folder, expected)
        if path is not None:
            return PulledProfile(path, read_profile_file(path), label, "cache"), None
        if problem and self.offline:
            raise ProfileError(
                f"the cached copy of {label} in {folder} is unusable ({problem}) and offline "
                "mode is on (--offline or HF_HUB_OFFLINE=1): pull it again with network access"
            )
        return None, (f"cached copy was unusable ({problem}); fetched again" if problem else None)

    def _require_network(self, label: str, local: bool = False) -> None:
        if self.offline and not local:
            raise ProfileError(
                f"{label} is not in the cache ({self.cache.root}) and offline mode is on (--offline or "
                f"HF_HUB_OFFLINE=1): run `duocal profiles pull {label}` once with network access, "
                f"or point {CACHE_ENV} at a cache that has it"
            )

    def _read(self, file: IndexFile) -> bytes:
        """A shipped file from the package, a pinned hf:// file, or a URL through the mirror; verified."""
        if file.local is not None:
            data, where = file.local.read_bytes(), str(file.local)
        elif file.url.startswith("hf://"):
            ref = parse_hf_ref(file.url)
            data, where = hub_download(ref, ref.path, offline=self.offline).read_bytes(), file.url
        else:
            return fetch(mirror_url(file.url, self.mirror), sha256=file.sha256, size=file.size, settings=self.settings)
        verify(data, where, file.sha256, file.size)
        return data

    def _shipped(self, entry: IndexEntry, file: IndexFile) -> PulledProfile:
        try:
            verify(file.local.read_bytes(), str(file.local), file.sha256, file.size)
        except (OSError, ProfileError) as err:
            raise ProfileError(
                f"shipped profile {entry.name} is damaged or missing ({err}); reinstall duocal"
            ) from None
        profile = read_profile_file(file.local)
        if profile.shape != entry.shape:
            raise ProfileError(
                f"{entry.name}: the index says {entry.shape.describe()} but {file.local} "
                f"holds {profile.shape.describe()}"
            )
        return PulledProfile(file.local, profile, entry.name, "shipped")

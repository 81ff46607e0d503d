"""Profiles on the Hugging Face Hub: `hf://OWNER/REPO[/PATH][@REVISION]` references.

Downloads go through `huggingface_hub.hf_hub_download`, so the Hub's own cache, auth and
revision handling apply. `HF_ENDPOINT`, `HF_HUB_CACHE` and `HF_HUB_OFFLINE` are read when a
call is made (huggingface_hub reads them once, at import), so a mirror endpoint or offline mode
set by the caller after import still takes effect. `huggingface_hub` itself is imported lazily:
`import duocal_runtime` stays light.

What a reference points at: no PATH means `profile.json` at the repo root (what `duocal
profiles push` writes); a PATH ending in `.json` is a duocal profile; a PATH ending in `.tsv` is
an upstream DuoAttention `full_attention_heads.tsv` with its `config.json` beside it; any other
PATH is a folder holding `profile.json`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from ..errors import ProfileError
from .download import DownloadSettings
from .formats import UPSTREAM, format_of, upstream_files

SCHEME = "hf://"
_REPO_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_TRUE = {"1", "true", "yes", "on"}


class HubError(ProfileError):
    """A Hub download or upload failed; the message says why and what to do."""


@dataclass(frozen=True)
class HubRef:
    """A file or folder in a Hub repo, as written `hf://[datasets/]OWNER/REPO[/PATH][@REVISION]`."""

    repo_id: str
    path: str = ""
    revision: str | None = None
    repo_type: str = "model"

    @property
    def pinned(self) -> bool:
        """True when the revision is a full commit sha (immutable), not a branch or tag."""
        return self.revision is not None and bool(_COMMIT.match(self.revision))

    @property
    def format(self) -> str:
        return format_of(self.path)

    def files(self) -> dict[str, str]:
        """Local name -> path in the repo, for every file this reference needs."""
        path = PurePosixPath(self.path) if self.path else None
        if path is None:
            return {"profile.json": "profile.json"}
        if self.path.endswith(".json"):
            return {"profile.json": str(path)}
        if self.format == UPSTREAM:
            return upstream_files(str(path), str(path.parent))
        return {"profile.json": str(path / "profile.json")}

    def __str__(self) -> str:
        prefix = "datasets/" if self.repo_type == "dataset" else ""
        path = f"/{self.path}" if self.path else ""
        rev = f"@{self.revision}" if self.revision else ""
        return f"{SCHEME}{prefix}{self.repo_id}{path}{rev}"


def parse_hf_ref(ref: str) -> HubRef:
    """Parse `hf://OWNER/REPO[/PATH][@REVISION]` (or `hf://datasets/OWNER/REPO...`)."""
    if not ref.startswith(SCHEME):
        raise ProfileError(f"{ref!r} is not a Hub reference: write hf://OWNER/REPO[/PATH][@REVISION]")
    body, revision = ref[len(SCHEME) :], None
    if "@" in body:
        body, revision = body.split("@", 1)
        if not revision:
            raise ProfileError(f"{ref!r} has an empty revision after '@': give a branch, tag or commit sha")
    repo_type = "model"
    if body.startswith("datasets/"):
        repo_type, body = "dataset", body[len("datasets/") :]
    parts = [p for p in body.split("/") if p]
    if len(parts) < 2 or not all(_REPO_PART.match(p) for p in parts[:2]):
        raise ProfileError(f"{ref!r} does not name a repo: write hf://OWNER/REPO[/PATH][@REVISION]")
    if any(p in (".", "..") for p in parts[2:]):
        raise ProfileError(f"{ref!r}: a path in a repo cannot contain '.' or '..'")
    return HubRef("/".join(parts[:2]), "/".join(parts[2:]), revision, repo_type)


def env_offline() -> bool:
    """HF_HUB_OFFLINE=1 (or true/yes/on): use only what is already cached."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def _cached(ref: HubRef, filename: str) -> bool:
    """Whether huggingface_hub's cache holds the file already (then the Hub need not answer)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(
        ref.repo_id,
        filename,
        cache_dir=os.environ.get("HF_HUB_CACHE") or None,
        revision=ref.revision,
        repo_type=ref.repo_type,
    )
    return isinstance(found, str)


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def check_reachable(endpoint: str | None = None, settings: DownloadSettings | None = None) -> None:
    """Refuse at once, with duocal's timeout and retries (DUOCAL_HTTP_*), a Hub nothing answers at:
    huggingface_hub would otherwise retry five times with backoff and log every attempt."""
    url = urlsplit(endpoint or _endpoint() or "https://huggingface.co")
    settings = settings or DownloadSettings.from_env()
    port = url.port or (443 if url.scheme == "https" else 80)
    last: OSError | None = None
    for attempt in range(settings.retries + 1):
        if attempt:
            time.sleep(settings.backoff * 2 ** (attempt - 1))
        try:
            socket.create_connection((url.hostname, port), timeout=settings.timeout).close()
            return
        except OSError as err:
            last = err
    raise HubError(
        f"could not reach {url.scheme}://{url.netloc} ({last.strerror or last}; {settings.retries + 1} tries): check "
        "the network (or HF_ENDPOINT), or set HF_HUB_OFFLINE=1 to use what is cached"
    )


@contextlib.contextmanager
def quiet_hub_retries():
    """huggingface_hub logs each retry as a warning: one clear error comes instead (ours)."""
    log = logging.getLogger("huggingface_hub")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def hub_download(ref: HubRef, filename: str, *, offline: bool = False, force: bool = False) -> Path:
    """Local path of `filename` in `ref`'s repo, downloaded through huggingface_hub's cache."""
    from huggingface_hub import hf_hub_download

    if not offline and not _cached(ref, filename):
        check_reachable()
    try:
        with quiet_hub_retries():
            return Path(
                hf_hub_download(
                    ref.repo_id,
                    filename,
                    repo_type=ref.repo_type,
                    revision=ref.revision,
                    cache_dir=os.environ.get("HF_HUB_CACHE") or None,
                    endpoint=_endpoint(),
                    local_files_only=offline,
                    force_download=force,
                )
            )
    except Exception as err:  # huggingface_hub raises many types; all become one clear error
        raise HubError(_download_message(ref, filename, err, offline)) from err


def _download_message(ref: HubRef, filename: str, err: Exception, offline: bool) -> str:
    from huggingface_hub import errors as hf

    where = f"{filename} from {ref}"
    endpoint = _endpoint() or "https://huggingface.co"
    if offline or isinstance(err, hf.OfflineModeIsEnabled):
        return (
            f"{where} is not in the Hugging Face cache and offline mode is on (--offline or "
            "HF_HUB_OFFLINE=1): run the same pull once with network access"
        )
    if isinstance(err, hf.LocalEntryNotFoundError):  # the Hub could not be reached, and nothing is cached
        return (
            f"could not reach {endpoint} for {where}, and it is not in the Hugging Face cache: check the network "
            "(or HF_ENDPOINT), then pull again"
        )
    if isinstance(err, hf.RepositoryNotFoundError):
        return f"{where}: repository {ref.repo_id} not found (or private: log in with `hf auth login`)"
    if isinstance(err, hf.RevisionNotFoundError):
        return f"{where}: revision {ref.revision!r} not found in {ref.repo_id}"
    if isinstance(err, hf.EntryNotFoundError):
        return f"{where}: no such file in the repo; check the path after OWNER/REPO"
    return f"could not download {where} from {endpoint}: {type(err).__name__}: {err}"


def upload_folder(
    folder: str | os.PathLike,
    ref: HubRef,
    *,
    token: str | None = None,
    private: bool | None = None,
    message: str = "Upload duocal profile",
) -> tuple[str, str]:
    """Create `ref`'s repo if needed and commit every file in `folder`; returns (repo URL, commit URL)."""
    from huggingface_hub import HfApi

    if ref.path or ref.revision:
        raise ProfileError(f"push to {ref}: give only hf://OWNER/REPO (files go to the repo root of main)")
    api = HfApi(endpoint=_endpoint(), token=token)
    try:
        repo = api.create_repo(ref.repo_id, repo_type=ref.repo_type, private=private, exist_ok=True)
        commit = api.upload_folder(
            repo_id=ref.repo_id, folder_path=str(folder), repo_type=ref.repo_type, commit_message=message
        )
    except Exception as err:  # HTTP, auth and validation errors all become one clear error
        raise HubError(
            f"push to {ref} failed: {type(err).__name__}: {err}. Check that you are logged in "
            "(`hf auth login` or --token / HF_TOKEN) with write access to that owner."
        ) from err
    return str(repo), commit.commit_url

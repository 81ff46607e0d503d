"""What a model argument means: a known name, a local folder, a `.gguf` file, or a Hub id.

A path (something that exists, or that looks like one: absolute, starting with `.` or `~`, more
than one `/`, a backslash, a file suffix such as `.gguf`) is never sent to the Hub: a missing one
is an error at once. A Hub id is `owner/name`; a bare name must be a known model or a folder here. A `.gguf` file is converted
once into `<cache>/models/gguf-<sha256 prefix>/`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from .fetch import MARKER, ModelFetchError, fetch_model, give_umask_modes, models_dir, sha256_file
from .gguf import convert_gguf
from .known import KNOWN_MODELS


def is_local_path(arg: str) -> bool:
    return (Path(arg).expanduser().exists() or arg.startswith(("/", ".", "~")) or arg.count("/") > 1
            or "\\" in arg or arg.lower().endswith((".gguf", ".json", ".safetensors", ".bin")))


def resolve_model(arg: str | Path, offline: bool = False, cache_dir: Path | None = None) -> str:
    """A folder transformers can load (as a string), or a Hub id passed through unchanged."""
    text = str(arg)
    if text in KNOWN_MODELS and not Path(text).exists():
        return str(fetch_model(text, offline=offline, cache_dir=cache_dir))
    if not is_local_path(text):
        if "/" not in text:
            raise ModelFetchError(f"model {text!r} is neither a folder here nor a known name ({', '.join(KNOWN_MODELS)}); "
                                  "give a model folder, a .gguf file, or a Hub id as owner/name")
        return text
    path = Path(text).expanduser()
    if not path.exists():
        raise ModelFetchError(f"model path {text!r} does not exist; give a model folder, a .gguf file, or a known "
                              f"name ({', '.join(KNOWN_MODELS)})")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelFetchError(f"model {text!r} is a file but not a .gguf file; give a model folder or a .gguf file")
        return str(converted_gguf(path, cache_dir))
    if not (path / "config.json").is_file():
        raise ModelFetchError(f"model folder {text!r} has no config.json; is it a transformers model folder?")
    return str(path)


def converted_gguf(gguf: Path, cache_dir: Path | None = None) -> Path:
    digest = sha256_file(gguf)
    root = models_dir(cache_dir)
    final = root / f"gguf-{digest[:16]}"
    if (final / MARKER).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".convert-") as tmp:
        built = Path(tmp) / "model"
        convert_gguf(gguf, built)
        (built / MARKER).write_text(json.dumps({"from": str(gguf.resolve()), "gguf_sha256": digest}, indent=2) + "\n")
        give_umask_modes(built)
        if not (final / MARKER).is_file():
            if final.exists():
                shutil.rmtree(final)
            os.replace(built, final)
    return final

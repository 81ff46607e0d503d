"""What a model argument means: a known name, a local folder, a `.gguf` file, or a Hub id; and what
duocal knows about it (`ModelRef`: the name profiles record, the profile the project ships, the
sink window and passkey format it is measured with).

A path (something that exists, or that looks like one: absolute, starting with `.` or `~`, more than
one `/`, a backslash, a file suffix such as `.gguf`) is never sent to the Hub: a missing one is an
error at once. A Hub id is `owner/name`; a bare name must be a known model or a folder here. A
`.gguf` file is converted once into `<cache>/models/gguf-<sha256 prefix>/`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .fetch import (
    MARKER,
    ModelFetchError,
    cached_model,
    fetch_model,
    give_umask_modes,
    is_complete,
    models_dir,
    sha256_file,
)
from .gguf import convert_gguf
from .known import KNOWN_MODELS

DEMO_NAME = "duocal/demo-model"  # what profiles record for the bundled demo model (never a machine's path)
DEMO_PROFILE = "demo-model.json"  # its shipped profile, in profiles/ (package duocal_runtime.prebuilt)
DEMO_SINK_WINDOW = (16, 64)  # (sink, recent) it retrieves with; trained on 1280 tokens at most
UPSTREAM_SINK_WINDOW = (64, 256)  # upstream DuoAttention's deployment sink window (sink, recent)


@dataclass(frozen=True)
class ModelRef:
    """A model argument resolved once: where it is and what duocal knows about it.

    `path` is a folder transformers loads (or a Hub id); `name` is what a profile records;
    `default_profile` the file of the profile the project ships for it (None if none);
    `sink_window` the (sink, recent) it is measured with when nothing else says; `passkey_format` the
    format of its passkey samples (the demo model's own symbols, else digits).
    """

    arg: str
    path: str
    name: str
    is_demo: bool
    default_profile: str | None
    sink_window: tuple[int, int]
    passkey_format: str

    @classmethod
    def resolve(cls, arg: str | Path | None, offline: bool = False, cache_dir: Path | None = None) -> ModelRef:
        """`arg` (None: the bundled demo model) as a `ModelRef`; fetches a known model once."""
        from duocal.data.passkey_formats import DEMO_PASSKEY_FORMAT

        from .known import DEMO_MODEL_DIR

        text = str(DEMO_MODEL_DIR) if arg is None else str(arg)
        path = resolve_model(text, offline=offline, cache_dir=cache_dir)
        if _same_folder(path, DEMO_MODEL_DIR):
            return cls(text, path, DEMO_NAME, True, _shipped(DEMO_PROFILE), DEMO_SINK_WINDOW, DEMO_PASSKEY_FORMAT)
        known = KNOWN_MODELS.get(text)
        profile = _shipped(known.profile) if known is not None and known.profile else None
        return cls(text, path, text, False, profile, _deploy_sink_window(profile), "digits")

    def load_config(self):
        from transformers import AutoConfig

        return self._load(AutoConfig.from_pretrained)

    def load_tokenizer(self):
        from transformers import AutoTokenizer

        return self._load(AutoTokenizer.from_pretrained)

    def load_model(self, dtype=None):
        """The model in eval mode, in its saved dtype or in `dtype` (a torch dtype)."""
        from transformers import AutoModelForCausalLM

        options = {} if dtype is None else {"dtype": dtype}
        return self._load(lambda path: AutoModelForCausalLM.from_pretrained(path, **options)).eval()

    def _load(self, loader):
        """`loader(self.path)`; a Hub id is checked reachable first (duocal's timeout and retries, one
        line), and whatever transformers raises becomes one line that names the model."""
        from duocal_runtime.fetching.hub import check_reachable, quiet_hub_retries

        if self.from_hub and not _hub_cached(self.path):
            check_reachable()
        try:
            with quiet_hub_retries():
                return loader(self.path)
        except (OSError, ValueError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ModelFetchError(f"cannot load model {self.arg!r}: {first}") from None

    @property
    def from_hub(self) -> bool:
        return not Path(self.path).exists()


def _hub_cached(repo_id: str) -> bool:
    """Whether huggingface_hub's cache holds the model's config (then the Hub need not answer)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def _same_folder(path: str, folder: Path) -> bool:
    try:
        return Path(path).resolve() == folder.resolve()
    except OSError:
        return False


def _shipped(name: str) -> str | None:
    shipped = resources.files("duocal_runtime.prebuilt") / name
    return str(shipped) if shipped.is_file() else None


def _deploy_sink_window(profile_file: str | None) -> tuple[int, int]:
    """The sink window a shipped profile deploys (read from its JSON, no runtime import)."""
    if profile_file is None:
        return UPSTREAM_SINK_WINDOW
    deploy = json.loads(Path(profile_file).read_text(encoding="utf-8")).get("deploy", {})
    sizes = deploy.get("sizes", {}).get("sink_window", deploy)
    return sizes.get("sink", UPSTREAM_SINK_WINDOW[0]), sizes.get("recent", UPSTREAM_SINK_WINDOW[1])


def is_local_path(arg: str) -> bool:
    return (
        Path(arg).expanduser().exists()
        or arg.startswith(("/", ".", "~"))
        or arg.count("/") > 1
        or "\\" in arg
        or arg.lower().endswith((".gguf", ".json", ".safetensors", ".bin"))
    )


def resolve_model(arg: str | Path, offline: bool = False, cache_dir: Path | None = None) -> str:
    """A folder transformers can load (as a string), or a Hub id passed through unchanged."""
    text = str(arg)
    if text in KNOWN_MODELS and not Path(text).exists():
        return str(fetch_model(text, offline=offline, cache_dir=cache_dir))
    if not is_local_path(text):
        if "/" not in text:
            raise ModelFetchError(
                f"model {text!r} is neither a folder here nor a known name ({', '.join(KNOWN_MODELS)}); "
                "give a model folder, a .gguf file, or a Hub id as owner/name"
            )
        return text
    path = Path(text).expanduser()
    if not path.exists():
        raise ModelFetchError(
            f"model path {text!r} does not exist; give a model folder, a .gguf file, or a known "
            f"name ({', '.join(KNOWN_MODELS)})"
        )
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
    if is_complete(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".convert-") as tmp:
        built = Path(tmp) / "model"
        convert_gguf(gguf, built)
        (built / MARKER).write_text(json.dumps({"from": str(gguf.resolve()), "gguf_sha256": digest}, indent=2) + "\n")
        give_umask_modes(built)
        if not is_complete(final):
            if final.exists():
                shutil.rmtree(final)
            os.replace(built, final)
    return final


def load_model(arg: str | Path | None):
    """The model of a known name, folder, .gguf file or Hub id (None: the demo model), in eval mode."""
    return ModelRef.resolve(arg).load_model()


def load_tokenizer(arg: str | Path | None):
    return ModelRef.resolve(arg).load_tokenizer()


def local_max_positions(name: str | None, cache_dir: Path | None = None) -> int | None:
    """`max_position_embeddings` of model `name` (as a profile records it) when its config.json is on
    this machine: the demo model, a fetched known model, a local folder, a Hub id in the Hub's cache.
    Reads JSON only; nothing is fetched or loaded. None when no config is here or it does not say."""
    from huggingface_hub import try_to_load_from_cache

    from .known import DEMO_MODEL_DIR

    if not name:
        return None
    if name == DEMO_NAME:
        config = DEMO_MODEL_DIR / "config.json"
    elif name in KNOWN_MODELS:
        folder = cached_model(name, cache_dir)
        config = folder / "config.json" if folder is not None else None
    elif is_local_path(name):
        config = Path(name).expanduser() / "config.json"
    else:
        hub = try_to_load_from_cache(name, "config.json") if name.count("/") == 1 else None
        config = Path(hub) if isinstance(hub, str) else None
    if config is None or not config.is_file():
        return None
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    text_config = data.get("text_config", data) if isinstance(data, dict) else None
    positions = text_config.get("max_position_embeddings") if isinstance(text_config, dict) else None
    return positions if isinstance(positions, int) and not isinstance(positions, bool) and positions > 0 else None

"""The KV-relevant shape of a model, and its fingerprint.

A profile belongs to one KV shape: (layers, query heads, KV heads, head dim). Two models with
the same shape can share a profile mechanically, but only the model it was calibrated on gives
meaningful scores; the name is recorded for that, the shape is enforced.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import ProfileError

SHAPE_FIELDS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim")


@dataclass(frozen=True)
class ModelShape:
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int

    def __post_init__(self):
        for name in SHAPE_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ProfileError(f"model field {name!r} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ProfileError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )

    @property
    def num_kv_heads_total(self) -> int:
        return self.num_hidden_layers * self.num_key_value_heads

    @property
    def fingerprint(self) -> str:
        """`sha256:` + 16 hex digits over the fields that decide KV cache shapes."""
        text = ";".join(f"{name}={getattr(self, name)}" for name in SHAPE_FIELDS)
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        return (
            f"{self.num_hidden_layers} layers x {self.num_key_value_heads} KV heads "
            f"({self.num_attention_heads} query heads, head_dim {self.head_dim})"
        )

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def shape_of_config(config: Any) -> ModelShape:
    """The KV shape of a transformers `PretrainedConfig` (or any object with the same fields)."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    try:
        layers = text_config.num_hidden_layers
        heads = text_config.num_attention_heads
    except AttributeError as err:
        raise ProfileError(f"config has no {err.name!r}: is this a decoder-only language model config?") from None
    kv_heads = getattr(text_config, "num_key_value_heads", None) or heads
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // heads
    return ModelShape(int(layers), int(heads), int(kv_heads), int(head_dim))


def config_fingerprint(config: Any) -> str:
    """Fingerprint of a transformers config by the fields that decide KV shapes."""
    return shape_of_config(config).fingerprint


def load_local_config(path: str | os.PathLike):
    """A transformers config from a local config.json or model folder; never a Hub request."""
    from transformers import AutoConfig

    path = Path(path)
    if not path.exists():
        raise ProfileError(f"model config {path} does not exist; give a config.json file or a model folder")
    if path.is_dir() and not (path / "config.json").is_file():
        raise ProfileError(f"model folder {path} has no config.json")
    try:
        return AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError, KeyError) as err:
        raise ProfileError(f"cannot read the model config {path}: {err}") from None

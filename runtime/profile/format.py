"""The duocal profile: one score per (layer, KV head), the model it belongs to, and defaults.

File format (JSON, `"format": "duocal.profile"`, `"version": 3`; versions 1 and 2 are read)::

    {
      "format": "duocal.profile",
      "version": 3,
      "model": {"name_or_path": ..., "revision": ..., "architecture": ...,
                "num_hidden_layers": L, "num_attention_heads": H, "num_key_value_heads": K,
                "head_dim": D, "fingerprint": "sha256:..."},
      "scores": [[s_00, ..., s_0K-1], ...],      # L rows of K floats in [0, 1]
      "source": {"kind": "calibration" | "profiler" | "upstream" | ..., ...},
      "deploy": {"sparsity": ..., "policy": "sink_window",
                 "sizes": {"sink_window": {"sink": 64, "recent": 256}, "h2o": {"heavy": ..., "recent": ...}}},
      "measurements": {"kept:sink_window": {"scores": [[...]], "settings": {...}, "source": "profiler"}}
    }                                           # optional; see profile/measurements.py

Versions 1 and 2 kept deploy sizes as flat fields (`sink`, `recent`, `heavy`, `h2o_recent`) that
several policies shared (`FLAT_DEPLOY_FIELDS`); they load with the same meaning.

A higher score means "keep this head's whole cache" (a retrieval head). Scores of calibrated
profiles are DuoAttention gate values (arXiv 2410.10819, section 3.2).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import ProfileError
from ..files.atomic import write_atomic
from ..files.strict_json import loads_strict
from ..policies import HeadPolicy
from . import READABLE_VERSIONS, VERSION
from .deploy_defaults import DeployDefaults, deploy_from_dict
from .measurements import Measurement, checked_table, measurement_from_dict
from .shape import SHAPE_FIELDS, ModelShape, shape_of_config

FORMAT = "duocal.profile"


@dataclass(frozen=True)
class ModelInfo:
    shape: ModelShape
    name_or_path: str | None = None
    revision: str | None = None
    architecture: str | None = None


@dataclass(frozen=True)
class Profile:
    model: ModelInfo
    scores: tuple[tuple[float, ...], ...]  # [layer][kv_head]
    source: dict[str, Any] = field(default_factory=dict)
    deploy: DeployDefaults = field(default_factory=DeployDefaults)
    measurements: dict[str, Measurement] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "scores", _checked_scores(self.scores, self.model.shape))
        for name, m in self.measurements.items():
            checked_table(m.scores, self.model.shape, f"measurements.{name}.scores")

    @property
    def shape(self) -> ModelShape:
        return self.model.shape

    def flat_scores(self) -> list[float]:
        """Scores in (layer, kv_head) order: index = layer * num_kv_heads + head."""
        return [s for row in self.scores for s in row]

    def check_compatible(self, config: Any) -> None:
        """Raise `ProfileError` unless this profile fits a model with transformers `config`."""
        theirs = shape_of_config(config)
        if theirs != self.shape:
            name = getattr(config, "_name_or_path", None) or "the model"
            raise ProfileError(
                f"profile is for {self.shape.describe()} ({self.model.name_or_path or 'unnamed model'}), "
                f"but {name} has {theirs.describe()}: use a profile made for this model "
                "(duocal profiles list, or duocal calibrate)"
            )

    def summary(self) -> str:
        """A few lines: the model, where the scores came from, their range, how it deploys."""
        flat, d = self.flat_scores(), self.deploy
        sizes = "; ".join(f"{name} {'+'.join(map(str, s.values()))}" for name, s in d.sizes.items()) or "defaults"
        return "\n".join(
            (
                f"profile of {self.model.name_or_path or 'an unnamed model'}: {self.shape.describe()}",
                f"scores from {self.source.get('kind', 'unknown')}: {min(flat):.2f} to {max(flat):.2f}, "
                f"{sum(s < 0.1 for s in flat)} of {len(flat)} below 0.1",
                f"deploys {d.policy} at sparsity {d.sparsity:g} (sizes: {sizes})",
                "measurements: " + (", ".join(sorted(self.measurements)) or "none"),
            )
        )

    def __repr__(self) -> str:
        d = self.deploy
        return (
            f"Profile({self.model.name_or_path or 'unnamed'}: {self.shape.num_hidden_layers} layers x "
            f"{self.shape.num_key_value_heads} KV heads, {self.source.get('kind', 'unknown')}, deploys {d.policy} "
            f"at {d.sparsity:g}, {len(self.measurements)} measurements)"
        )

    def with_deploy(self, *policies: HeadPolicy, **changes) -> Profile:
        """This profile with deploy `changes` (sparsity, policy) and the sizes of `policies` recorded."""
        return replace(self, deploy=replace(self.deploy, **changes).with_sizes(*policies))

    def to_dict(self) -> dict[str, Any]:
        m = self.model
        data = {
            "format": FORMAT,
            "version": VERSION,
            "model": {
                "name_or_path": m.name_or_path,
                "revision": m.revision,
                "architecture": m.architecture,
                **m.shape.to_dict(),
                "fingerprint": m.shape.fingerprint,
            },
            "scores": [list(row) for row in self.scores],
            "source": self.source,
            "deploy": self.deploy.to_dict(),
        }
        if self.measurements:
            data["measurements"] = {name: m.to_dict() for name, m in self.measurements.items()}
        return data


def _checked_scores(scores, shape: ModelShape) -> tuple[tuple[float, ...], ...]:
    if not isinstance(scores, (list, tuple)) or not all(isinstance(r, (list, tuple)) for r in scores):
        raise ProfileError("scores must be a list of rows (one per layer) of numbers (one per KV head)")
    lengths = {len(r) for r in scores}
    if len(lengths) > 1:
        raise ProfileError(
            f"scores is ragged: rows have lengths {sorted(lengths)}; every layer needs one score per KV head"
        )
    got = (len(scores), lengths.pop() if lengths else 0)
    want = (shape.num_hidden_layers, shape.num_key_value_heads)
    if got != want:
        raise ProfileError(
            f"scores is {got[0]}x{got[1]} but the model block says {want[0]} layers x {want[1]} KV heads"
        )
    rows = []
    for layer, row in enumerate(scores):
        for head, s in enumerate(row):
            if isinstance(s, bool) or not isinstance(s, (int, float)):
                raise ProfileError(f"score [{layer}][{head}] is {s!r}, not a number")
            if not math.isfinite(s):
                raise ProfileError(f"score [{layer}][{head}] is {s}; scores must be finite numbers in [0, 1]")
            if not 0.0 <= s <= 1.0:
                raise ProfileError(
                    f"score [{layer}][{head}] = {s} is outside [0, 1] "
                    "(raw upstream gates: import them with `duocal profiles import-upstream`, which clips)"
                )
        rows.append(tuple(float(s) for s in row))
    return tuple(rows)


def profile_from_dict(data: Any) -> Profile:
    """Validate a decoded profile JSON object and build a `Profile`."""
    if not isinstance(data, dict):
        raise ProfileError("a profile must be a JSON object")
    if data.get("format") != FORMAT:
        raise ProfileError(f"unknown format {data.get('format')!r}: expected {FORMAT!r}")
    if data.get("version") not in READABLE_VERSIONS or isinstance(data.get("version"), bool):
        raise ProfileError(
            f"unsupported profile version {data.get('version')!r}: this duocal reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}; upgrade duocal or re-export the profile"
        )
    if data.get("measurements") is not None and data["version"] == 1:
        raise ProfileError("measurements need profile version 2 or later; the file says version 1")
    for key in ("model", "scores", "deploy"):
        if key not in data:
            raise ProfileError(f"missing field {key!r}")
    model = data["model"]
    if not isinstance(model, dict):
        raise ProfileError("field 'model' must be an object")
    for key in (*SHAPE_FIELDS, "fingerprint"):
        if key not in model:
            raise ProfileError(f"missing field 'model.{key}'")
    shape = ModelShape(**{k: model[k] for k in SHAPE_FIELDS})
    if model["fingerprint"] != shape.fingerprint:
        raise ProfileError(
            f"fingerprint mismatch: the file says {model['fingerprint']} but its model shape "
            f"({shape.describe()}) gives {shape.fingerprint}; the file was edited or corrupted"
        )
    deploy = deploy_from_dict(data["deploy"], data["version"])
    for key in ("name_or_path", "revision", "architecture"):
        if model.get(key) is not None and not isinstance(model[key], str):
            raise ProfileError(f"model.{key} must be a string or null, got {model[key]!r:.60}")
    source = data.get("source") or {}
    if not isinstance(source, dict):
        raise ProfileError(f"field 'source' must be an object (how the scores were obtained), got {source!r:.60}")
    measured = data.get("measurements") or {}
    if not isinstance(measured, dict):
        raise ProfileError("field 'measurements' must be an object of named measurements")
    measurements = {str(name): measurement_from_dict(str(name), m, shape) for name, m in measured.items()}
    info = ModelInfo(shape, model.get("name_or_path"), model.get("revision"), model.get("architecture"))
    return Profile(info, data["scores"], dict(source), deploy, measurements)


def profile_to_json(profile: Profile) -> str:
    """Stable, diff-friendly JSON: sorted-free fixed key order, one score row per line."""
    data = profile.to_dict()
    rows = data.pop("scores")
    measured = data.pop("measurements", None)
    text = json.dumps(data, indent=2, ensure_ascii=False)
    if measured is not None:
        text = text[:-2] + ',\n  "measurements": ' + json.dumps(measured, ensure_ascii=False) + "\n}"
    score_lines = ",\n".join("    " + json.dumps(row) for row in rows)
    head, tail = text.split('\n  "source"', 1)
    return f'{head}\n  "scores": [\n{score_lines}\n  ],\n  "source"{tail}\n'


def save_profile(profile: Profile, path: str | os.PathLike) -> Path:
    """Write `profile` as JSON atomically (temporary file + rename)."""
    return write_atomic(path, profile_to_json(profile))


def read_profile_file(path: str | os.PathLike) -> Profile:
    path = Path(path)
    if path.exists() and not path.is_dir() and not path.is_file():
        raise ProfileError(f"{path} is not a regular file (a fifo or a device?); give a profile file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileError(f"profile file {path} does not exist") from None
    except IsADirectoryError:
        raise ProfileError(f"{path} is a folder, not a profile file") from None
    except UnicodeDecodeError:
        raise ProfileError(f"{path} is not a text JSON file (corrupt or binary)") from None
    data = loads_strict(text, str(path))
    try:
        return profile_from_dict(data)
    except ProfileError as err:
        raise ProfileError(f"{path}: {err}") from None

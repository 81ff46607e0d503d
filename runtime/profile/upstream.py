"""Interop with upstream DuoAttention (mit-han-lab/duo-attention) head patterns.

An upstream pattern directory holds `full_attention_heads.tsv` (one row per layer, one raw gate
per KV head, written by ``np.savetxt``: ``%.18e``, tab-separated, values may be slightly outside
[0, 1]) and `config.json` (the training arguments). Upstream clips gates to [0, 1] on load
(``load_attn_pattern``), trains with sink 128 / recent 256 and deploys with sink 64 / recent 256.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from ..errors import ProfileError
from ..files.atomic import write_files_atomic
from ..policies import SinkWindow
from . import CONFIG_NAME, TSV_NAME
from .format import DeployDefaults, ModelInfo, Profile
from .shape import ModelShape, load_local_config, shape_of_config

UPSTREAM_REPO = "mit-han-lab/duo-attention"
UPSTREAM_COMMIT = "fe93c314ae87306ef6629dc16713250b4718ffe7"
DEPLOY_SINK, DEPLOY_RECENT = 64, 256

_LLAMA3 = ModelShape(32, 32, 8, 128)
# The six models upstream published patterns for: (Hub id, architecture, KV shape).
KNOWN_MODELS: dict[str, tuple[str, str, ModelShape]] = {
    "Llama-2-7B-32K-Instruct": (
        "togethercomputer/Llama-2-7B-32K-Instruct",
        "LlamaForCausalLM",
        ModelShape(32, 32, 32, 128),
    ),
    "Llama-3-8B-Instruct-Gradient-1048k": (
        "gradientai/Llama-3-8B-Instruct-Gradient-1048k",
        "LlamaForCausalLM",
        _LLAMA3,
    ),
    "Llama-3-8B-Instruct-Gradient-4194k": (
        "gradientai/Llama-3-8B-Instruct-Gradient-4194k",
        "LlamaForCausalLM",
        _LLAMA3,
    ),
    "Meta-Llama-3.1-8B-Instruct": ("meta-llama/Meta-Llama-3.1-8B-Instruct", "LlamaForCausalLM", _LLAMA3),
    "Mistral-7B-Instruct-v0.2": ("mistralai/Mistral-7B-Instruct-v0.2", "MistralForCausalLM", _LLAMA3),
    "Mistral-7B-Instruct-v0.3": ("mistralai/Mistral-7B-Instruct-v0.3", "MistralForCausalLM", _LLAMA3),
}
_TRAINING_KEYS = (
    "lr",
    "reg_weight",
    "num_steps",
    "sink_size",
    "recent_size",
    "context_length_min",
    "context_length_max",
    "num_passkeys",
    "dataset_name",
    "dataset_format",
    "seed",
)


def parse_upstream_tsv(text: str, where: str = TSV_NAME) -> list[list[float]]:
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = [float(x) for x in line.split()]
        except ValueError:
            raise ProfileError(f"{where} line {lineno} is not tab-separated numbers: {line[:60]!r}") from None
        if not all(math.isfinite(x) for x in row):
            raise ProfileError(f"{where} line {lineno} holds a non-finite gate (nan or inf): {line[:60]!r}")
        if rows and len(row) != len(rows[0]):
            raise ProfileError(
                f"{where} line {lineno} holds {len(row)} gates and the first line {len(rows[0])}: every line holds "
                "one gate per KV head of its layer (an empty cell or a missing gate?)"
            )
        rows.append(row)
    if not rows:
        raise ProfileError(f"{where} is empty")
    return rows


def _model_info(config: dict, model_config: str | os.PathLike | None) -> ModelInfo:
    name = Path(str(config.get("model_name") or "")).name
    if model_config is not None:
        cfg = load_local_config(model_config)
        archs = getattr(cfg, "architectures", None) or [None]
        return ModelInfo(shape_of_config(cfg), getattr(cfg, "_name_or_path", None) or name or None, None, archs[0])
    if name not in KNOWN_MODELS:
        raise ProfileError(
            f"unknown upstream model {name!r}: pass --model-config PATH (the model's config.json) "
            f"so its shape is known; built in: {', '.join(KNOWN_MODELS)}"
        )
    hub_id, arch, shape = KNOWN_MODELS[name]
    return ModelInfo(shape, hub_id, None, arch)


def import_upstream(
    pattern_dir: str | os.PathLike,
    model_config: str | os.PathLike | None = None,
    commit: str | None = None,
) -> Profile:
    """Read an upstream pattern directory into a profile (gates clipped to [0, 1])."""
    pattern_dir = Path(pattern_dir)
    tsv, cfg = pattern_dir / TSV_NAME, pattern_dir / CONFIG_NAME
    for path in (tsv, cfg):
        if not path.is_file():
            raise ProfileError(
                f"{pattern_dir} is not an upstream DuoAttention pattern directory: {path.name} is missing"
            )
    try:
        config = json.loads(cfg.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise ProfileError(f"{cfg} is not valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise ProfileError(
            f"{cfg} must hold a JSON object (upstream's training arguments), not a {type(config).__name__}"
        )
    tsv_bytes = tsv.read_bytes()
    raw = parse_upstream_tsv(tsv_bytes.decode(errors="replace"), str(tsv))
    info = _model_info(config, model_config)
    scores = [[min(1.0, max(0.0, g)) for g in row] for row in raw]
    source = {
        "kind": "upstream",
        "repository": UPSTREAM_REPO,
        "commit": commit,
        "pattern": config.get("exp_name") or pattern_dir.name,
        "tsv_sha256": hashlib.sha256(tsv_bytes).hexdigest(),
        "clipped_to_unit_interval": sum(g < 0.0 or g > 1.0 for row in raw for g in row),
        "training": {k: config[k] for k in _TRAINING_KEYS if k in config},
    }
    deploy = DeployDefaults.of(SinkWindow(DEPLOY_SINK, DEPLOY_RECENT))
    return Profile(info, scores, source, deploy)


def export_upstream(profile: Profile, out_dir: str | os.PathLike) -> Path:
    """Write `profile` as an upstream pattern directory (TSV in np.savetxt's format + config.json)."""
    out_dir = Path(out_dir)
    lines = ["\t".join(f"{s:.18e}" for s in row) for row in profile.scores]
    training: dict[str, Any] = dict(profile.source.get("training") or {})
    config = {
        "model_name": profile.model.name_or_path,
        "sink_size": training.get("sink_size", profile.deploy.sink_window.sink),
        "recent_size": training.get("recent_size", profile.deploy.sink_window.recent),
        "deploy_sink_size": profile.deploy.sink_window.sink,
        "deploy_recent_size": profile.deploy.sink_window.recent,
        **{k: v for k, v in training.items() if k not in ("sink_size", "recent_size")},
        "exported_by": "duocal",
    }
    return write_files_atomic(
        out_dir, {TSV_NAME: "\n".join(lines) + "\n", CONFIG_NAME: json.dumps(config, indent=2) + "\n"}
    )

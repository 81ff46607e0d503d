"""Publish a profile as a Hub repo: `profile.json`, a scores heatmap and a README card.

The card says which model the profile is for, its KV shape, how the scores were obtained
(calibration settings, profiler, or upstream import), the deployment defaults and what they
save, and how to pull it. The upload itself is `duocal_runtime.fetching.hub.upload_folder`.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duocal_runtime as dr
from duocal_runtime.fetching.hub import HubRef, parse_hf_ref, upload_folder

from .plots import scores_heatmap

PROFILE_FILE, HEATMAP_FILE, CARD_FILE = "profile.json", "scores.png", "README.md"
CARD_CONTEXT = 32768
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class PushResult:
    repo_url: str
    commit_url: str
    files: tuple[str, ...]


def _front_matter(profile: dr.Profile) -> str:
    lines = ["---", "library_name: duocal", "tags:", "- duocal", "- duo-attention", "- kv-cache", "- long-context"]
    name = profile.model.name_or_path or ""
    if _HUB_ID.match(name):  # only a Hub id is a valid base_model; local paths are left out
        lines.append(f"base_model: {name}")
    return "\n".join([*lines, "---", ""])


def _settings_rows(source: dict[str, Any]) -> list[tuple[str, str]]:
    """Flat (key, value) rows of the profile's provenance: nested dicts one level deep, long lists summarised."""
    rows = []
    for key, value in source.items():
        items = value.items() if isinstance(value, dict) else [("", value)]
        for sub, v in items:
            text = json.dumps(v) if not isinstance(v, str) else v
            if len(text) > 80:
                text = text[:77] + "..."
            rows.append((f"{key}.{sub}" if sub else key, text))
    return rows


def _savings(profile: dr.Profile) -> str:
    plan = dr.plan(profile)
    memory, sink_window = plan.memory_report(CARD_CONTEXT), profile.deploy.sink_window
    return (
        f"At the default sparsity {profile.deploy.sparsity:g}, {plan.num_bounded} of {plan.num_heads} KV heads "
        f"use `{profile.deploy.policy}` (sink {sink_window.sink}, recent {sink_window.recent}); "
        f"the KV cache at {CARD_CONTEXT} tokens is {memory['fraction_of_full']:.1%} of full attention."
    )


def render_card(profile: dr.Profile, target: HubRef) -> str:
    """The README.md of a pushed profile (Markdown with Hub YAML front matter)."""
    model = profile.model.name_or_path or "an unnamed model"
    table = "\n".join(f"| `{k}` | {v.replace('|', '/')} |" for k, v in _settings_rows(profile.source))
    deploy = ", ".join(f"{k}={v}" for k, v in profile.deploy.to_dict().items())
    return "\n".join(
        [
            _front_matter(profile),
            f"# duocal profile for {model}",
            "",
            "Which attention heads of this model need their whole KV cache (retrieval heads) and which",
            "only need sink + recent tokens (streaming heads): one score in [0, 1] per (layer, KV head),",
            "as in DuoAttention (Xiao et al., ICLR 2025, arXiv 2410.10819).",
            "",
            f"- model: `{model}`" + (f" (revision `{profile.model.revision}`)" if profile.model.revision else ""),
            f"- shape: {profile.shape.describe()}, fingerprint `{profile.shape.fingerprint}`",
            f"- source: {profile.source.get('kind', 'unknown')}",
            f"- deploy defaults: {deploy}",
            "",
            _savings(profile),
            "",
            f"![scores per layer and KV head]({HEATMAP_FILE})",
            "",
            "## How the scores were obtained",
            "",
            "| setting | value |",
            "|---|---|",
            table or "| (none recorded) | |",
            "",
            "## Use",
            "",
            "```bash",
            f"duocal profiles pull {target}",
            "```",
            "",
            "```python",
            "import duocal_runtime as dr",
            f'profile = dr.load_profile("{target}")',
            "plan = dr.plan(profile, sparsity=0.5)",
            "```",
            "",
        ]
    )


def push_profile(
    profile_ref: str | os.PathLike,
    target: str,
    *,
    token: str | None = None,
    private: bool | None = None,
    message: str | None = None,
) -> PushResult:
    """Upload `profile_ref` (path, name, URL or hf://) to `target` = hf://OWNER/REPO with card and heatmap."""
    ref = parse_hf_ref(target)
    profile = dr.load_profile(profile_ref)
    with tempfile.TemporaryDirectory(prefix="duocal-push-") as tmp:
        folder = Path(tmp)
        dr.save_profile(profile, folder / PROFILE_FILE)
        scores_heatmap(profile, folder / HEATMAP_FILE)
        (folder / CARD_FILE).write_text(render_card(profile, ref), encoding="utf-8")
        files = tuple(sorted(p.name for p in folder.iterdir()))
        repo_url, commit_url = upload_folder(
            folder,
            ref,
            token=token,
            private=private,
            message=message or f"duocal profile for {profile.model.name_or_path or 'a model'}",
        )
    return PushResult(repo_url, commit_url, files)

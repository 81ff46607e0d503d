"""`profiles push` and `hf://` pulls, against a fake Hub on 127.0.0.1.

Approach (the issue allows either): a local HTTP server that answers the few Hub endpoints
huggingface_hub really calls (tests/helpers/fake_hub.py: create repo, validate YAML, preupload, commit,
resolve), with HF_ENDPOINT pointing at it. So uploads and downloads go through the real
`HfApi.create_repo` / `upload_folder` / `hf_hub_download` code, its cache (HF_HUB_CACHE in
tmp_path) and its offline mode (HF_HUB_OFFLINE), and nothing leaves the machine.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.cli import app
from duocal.reports.hub_card import render_card
from duocal.reports.plots import scores_heatmap
from duocal_runtime.fetching.hub import HubRef
from duocal_runtime.fetching.pull import pull

from helpers.fake_hub import FakeHub
from helpers.http_server import LocalServer
from helpers.profiles import random_profile, write_pattern

runner = CliRunner()


@pytest.fixture
def hub(tmp_path, monkeypatch):
    fake = FakeHub()
    with LocalServer(app=fake) as server:
        fake.base_url = server.base_url
        monkeypatch.setenv("HF_ENDPOINT", server.base_url)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.setenv("DUOCAL_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("DUOCAL_INDEX", raising=False)
        yield fake, server


@pytest.fixture
def upstream_profile(tmp_path) -> Path:
    """A profile imported from an upstream-layout pattern, so it carries training settings."""
    gates = np.random.default_rng(3).uniform(0, 1, (32, 8))
    profile = dr.import_upstream(write_pattern(tmp_path / "pattern", gates), commit="f" * 40)
    return dr.save_profile(profile, tmp_path / "upstream.json")


def test_push_creates_the_repo_and_uploads_profile_card_and_heatmap(hub, upstream_profile):
    fake, _ = hub
    result = runner.invoke(
        app, ["profiles", "push", str(upstream_profile), "hf://me/mistral-duo", "--token", "hf_test"]
    )
    assert result.exit_code == 0, result.output
    assert fake.created[0]["name"] == "mistral-duo" and fake.created[0]["organization"] == "me"
    assert "Bearer hf_test" in fake.auth
    files = fake.files("me/mistral-duo")
    assert {"profile.json", "README.md", "scores.png"} <= set(files)
    assert dr.profile_from_dict(json.loads(files["profile.json"])).scores == dr.load_profile(upstream_profile).scores
    card = files["README.md"].decode()
    assert card.startswith("---\nlibrary_name: duocal") and "base_model: mistralai/Mistral-7B-Instruct-v0.2" in card
    assert "32 layers x 8 KV heads" in card and "![scores per layer and KV head](scores.png)" in card
    assert "| `training.sink_size` | 128 |" in card and "| `training.lr` | 0.02 |" in card
    assert "duocal profiles pull hf://me/mistral-duo" in card
    assert files["scores.png"].startswith(b"\x89PNG\r\n\x1a\n")
    assert (
        result.stdout.strip().splitlines()[-1]
        == f"{fake.base_url}/me/mistral-duo/commit/{fake.branches['me/mistral-duo']}"
    )


def test_a_pushed_profile_pulls_back_through_the_hub_and_then_offline(hub, upstream_profile, monkeypatch):
    fake, server = hub
    runner.invoke(app, ["profiles", "push", str(upstream_profile), "hf://me/mistral-duo"])
    original = dr.load_profile(upstream_profile)
    result = runner.invoke(app, ["profiles", "pull", "hf://me/mistral-duo"])
    assert result.exit_code == 0, result.output
    assert dr.load_profile(result.stdout.strip().splitlines()[-1]).scores == original.scores
    commit = fake.branches["me/mistral-duo"]
    pinned = pull(f"hf://me/mistral-duo/profile.json@{commit}")
    assert pinned.origin == "hub" and pinned.profile.scores == original.scores
    assert server.hits["/me/mistral-duo/resolve/main/profile.json"] >= 1
    before = sum(server.hits.values())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert dr.load_profile("hf://me/mistral-duo").scores == original.scores  # from huggingface_hub's cache
    assert sum(server.hits.values()) == before
    with pytest.raises(dr.ProfileError, match="not in the Hugging Face cache and offline mode is on"):
        pull("hf://me/never-pulled")


def test_an_upstream_pattern_on_the_hub_is_converted(hub, tmp_path):
    fake, _ = hub
    folder = write_pattern(tmp_path / "pat", np.full((32, 8), 0.25))
    fake.add_commit(
        "lab/patterns", {f"mistral/{n}": (folder / n).read_bytes() for n in ("full_attention_heads.tsv", "config.json")}
    )
    pulled = pull("hf://lab/patterns/mistral/full_attention_heads.tsv")
    assert pulled.profile.shape.num_key_value_heads == 8 and pulled.profile.scores[0][0] == 0.25


def test_hub_errors_say_what_is_wrong(hub, upstream_profile):
    fake, _ = hub
    with pytest.raises(dr.ProfileError, match="repository nobody/nothing not found"):
        pull("hf://nobody/nothing")
    fake.add_commit("me/empty", {"other.txt": b"x"})
    with pytest.raises(dr.ProfileError, match="no such file in the repo"):
        pull("hf://me/empty")
    result = runner.invoke(app, ["profiles", "push", str(upstream_profile), "hf://me/repo/sub"])
    assert result.exit_code == 1 and "give only hf://OWNER/REPO" in result.stderr
    result = runner.invoke(app, ["profiles", "push", str(upstream_profile), "me/repo"])
    assert result.exit_code == 1 and "not a Hub reference" in result.stderr


def test_an_index_entry_can_pin_a_hub_file(hub, tmp_path, monkeypatch):
    fake, _ = hub
    profile = random_profile(layers=2, kv_heads=2)
    data = dr.save_profile(profile, tmp_path / "p.json").read_bytes()
    commit = fake.add_commit("me/tiny", {"profile.json": data})
    entry = {
        "name": "hub/tiny",
        "model": "test/model",
        "format": "duocal",
        "shape": profile.shape.to_dict(),
        "files": [
            {
                "name": "profile.json",
                "url": f"hf://me/tiny/profile.json@{commit}",
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": len(data),
            }
        ],
    }
    (tmp_path / "index.json").write_text(json.dumps({"format": "duocal.index", "version": 1, "profiles": [entry]}))
    monkeypatch.setenv("DUOCAL_INDEX", str(tmp_path / "index.json"))
    assert dr.load_profile("hub/tiny").scores == profile.scores
    assert pull("hub/tiny").origin == "cache"


# --- the card and the heatmap on their own ---------------------------------------------------


def test_the_card_names_a_base_model_only_for_hub_ids():
    assert "base_model: test/model" in render_card(random_profile(), HubRef("me/r"))
    local = random_profile()
    local = dr.Profile(dr.ModelInfo(local.shape, "/home/me/model", None, None), local.scores, {"kind": "profiler"})
    card = render_card(local, HubRef("me/r"))
    assert "base_model" not in card and "| `kind` | profiler |" in card


def test_scores_heatmap_writes_a_png_for_a_profile_or_any_matrix(tmp_path):
    path = scores_heatmap(random_profile(layers=6, kv_heads=3, heads=6), tmp_path / "a" / "h.png", title="six layers")
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50
    assert scores_heatmap([[0.0, 2.0], [1.0, 0.5]], tmp_path / "m.png", vmax=2.0).exists()
    with pytest.raises(ValueError, match="rectangular"):
        scores_heatmap([[0.1], [0.2, 0.3]], tmp_path / "bad.png")

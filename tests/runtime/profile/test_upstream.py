import json

import numpy as np
import pytest

import duocal_runtime as dr
from duocal_runtime.profile.upstream import KNOWN_MODELS

from helpers.profiles import write_pattern


def test_import_clips_and_records_provenance(tmp_path):
    rng = np.random.default_rng(0)
    gates = rng.uniform(-1e-4, 1.0001, size=(32, 8))
    gates[0, 0], gates[0, 1] = -2.3e-5, 1.00001
    folder = write_pattern(tmp_path / "pat", gates)
    text = (folder / "full_attention_heads.tsv").read_text()
    assert "\t" in text and "e-05" in text
    profile = dr.import_upstream(folder, commit="abc")
    assert profile.scores[0][0] == 0.0 and profile.scores[0][1] == 1.0
    np.testing.assert_allclose(np.array(profile.scores), np.clip(gates, 0, 1), rtol=0, atol=0)
    assert profile.model.name_or_path == "mistralai/Mistral-7B-Instruct-v0.2"
    assert profile.source["kind"] == "upstream" and profile.source["commit"] == "abc"
    assert profile.source["training"]["sink_size"] == 128 and profile.source["training"]["recent_size"] == 256
    assert profile.deploy.sink_window == dr.SinkWindow(64, 256)


def test_unknown_model_needs_config(tmp_path):
    folder = write_pattern(tmp_path / "pat", np.full((2, 2), 0.5), model_name="models/MyModel")
    with pytest.raises(dr.ProfileError, match="--model-config"):
        dr.import_upstream(folder)
    config = tmp_path / "cfg"
    config.mkdir()
    (config / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 2,
                "hidden_size": 32,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "architectures": ["LlamaForCausalLM"],
            }
        )
    )
    profile = dr.import_upstream(folder, model_config=config)
    assert profile.shape == dr.ModelShape(2, 4, 2, 8)
    wrong = write_pattern(tmp_path / "wrong", np.full((3, 2), 0.5), model_name="models/MyModel")
    with pytest.raises(dr.ProfileError, match="scores is 3x2 but the model block says 2 layers x 2 KV heads"):
        dr.import_upstream(wrong, model_config=config)


def test_missing_files_and_garbage(tmp_path):
    with pytest.raises(dr.ProfileError, match=r"full_attention_heads.tsv is missing"):
        dr.import_upstream(tmp_path)
    folder = write_pattern(tmp_path / "pat", np.full((32, 8), 0.5))
    (folder / "full_attention_heads.tsv").write_text("1.0\tabc\n")
    with pytest.raises(dr.ProfileError, match="line 1"):
        dr.import_upstream(folder)


def test_export_round_trip(tmp_path):
    gates = np.random.default_rng(1).uniform(0, 1, size=(32, 8))
    profile = dr.import_upstream(write_pattern(tmp_path / "pat", gates))
    dr.export_upstream(profile, tmp_path / "out")
    again = dr.import_upstream(tmp_path / "out")
    assert again.scores == profile.scores
    assert json.loads((tmp_path / "out" / "config.json").read_text())["sink_size"] == 128
    line = (tmp_path / "out" / "full_attention_heads.tsv").read_text().splitlines()[0]
    assert len(line.split("\t")) == 8 and all(len(x.split("e")[0]) == 20 for x in line.split("\t"))


@pytest.mark.parametrize("name", sorted(KNOWN_MODELS))
def test_published_patterns(upstream_patterns, name):
    folder = upstream_patterns / name
    profile = dr.import_upstream(folder)
    kv = 32 if name == "Llama-2-7B-32K-Instruct" else 8
    assert profile.shape.num_hidden_layers == 32 and profile.shape.num_key_value_heads == kv
    sums = dict(line.split()[::-1] for line in (upstream_patterns / "SHA256SUMS").read_text().splitlines())
    assert profile.source["tsv_sha256"] == sums[f"{name}/full_attention_heads.tsv"]
    for sparsity in (0.25, 0.5, 0.75):
        plan = dr.plan(profile, sparsity=sparsity)
        assert plan.num_bounded == round(sparsity * 32 * kv)
        assert plan == dr.plan(dr.import_upstream(folder), sparsity=sparsity)


def test_mistral_v02_ties_are_resolved(upstream_patterns):
    profile = dr.import_upstream(upstream_patterns / "Mistral-7B-Instruct-v0.2")
    flat = np.array(profile.flat_scores())
    threshold = np.quantile(flat, 0.5)
    assert (flat == threshold).sum() > 1  # the ties upstream breaks with random noise
    assert dr.plan(profile, sparsity=0.5).num_bounded == 128

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.cli import app

from helpers.profiles import random_profile, write_pattern

runner = CliRunner()


def test_show_json_contract(tmp_path):
    profile = random_profile(layers=4, kv_heads=2, heads=4, head_dim=8)
    path = dr.save_profile(profile, tmp_path / "p.json")
    result = runner.invoke(app, ["profiles", "show", str(path), "--sparsity", "0.5", "--context", "1000", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["num_layers"] == 4 and data["num_kv_heads"] == 2
    assert data["sparsity"] == 0.5 and sum(data["retrieval_heads_per_layer"]) == 4
    plan = dr.plan(profile, sparsity=0.5)
    assert data["kv_bytes_full"] == 8 * 1000 * 2 * 8 * 2
    assert data["kv_bytes_plan"] == plan.kv_bytes(1000, 1, "bfloat16")


def test_show_counts_quantized_full_heads_and_refuses_other_widths(tmp_path):
    profile = random_profile(layers=4, kv_heads=2, heads=4, head_dim=8)
    path = dr.save_profile(profile, tmp_path / "p.json")
    show = ["profiles", "show", str(path), "--sparsity", "0.5", "--context", "1000", "--json", "--kv-bits"]
    data = json.loads(runner.invoke(app, [*show, "4"]).stdout)
    assert data["kv_bits"] == 4
    assert data["kv_bytes_plan"] == dr.plan(profile, sparsity=0.5, kv_bits=4).kv_bytes(1000, 1, "bfloat16")
    assert data["kv_bytes_plan"] < dr.plan(profile, sparsity=0.5).kv_bytes(1000, 1, "bfloat16")
    table = runner.invoke(app, ["profiles", "show", str(path), "--kv-bits", "8"])
    assert "full heads in 8-bit codes" in table.stdout
    refused = runner.invoke(app, [*show, "3"])
    assert refused.exit_code == 1 and "kv_bits must be one of 16, 8, 4, got 3" in refused.output


def test_show_table_default_context(tmp_path):
    path = dr.save_profile(random_profile(), tmp_path / "p.json")
    result = runner.invoke(app, ["profiles", "show", str(path)])
    assert result.exit_code == 0, result.output
    assert "score histogram" in result.stdout and "32768 tokens" in result.stdout
    assert "are unknown here" in result.stdout and "pass --context" in result.stdout


def test_show_sizes_memory_at_the_models_own_positions_when_its_config_is_here(tmp_path):
    demo = runner.invoke(app, ["profiles", "show", "demo-model", "--json"], env={"COLUMNS": "200"})
    assert demo.exit_code == 0, demo.output
    data = json.loads(demo.stdout)
    assert data["context"] == 4096 and data["context_from"] == "the model's max_position_embeddings"
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    profile = dr.save_profile(replace_model_name(random_profile(), str(folder)), tmp_path / "p.json")
    table = runner.invoke(app, ["profiles", "show", str(profile)], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "context 2048 tokens: the model's max_position_embeddings" in table.stdout
    assert "KV cache at 2048 tokens" in table.stdout
    given = runner.invoke(app, ["profiles", "show", str(profile), "--context", "100", "--json"])
    assert json.loads(given.stdout)["context"] == 100


def test_show_prints_the_bounded_policy_as_words_not_a_dict():
    result = runner.invoke(app, ["profiles", "show", "demo-model"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "bounded heads' policy: sink_window (sink 16, recent 64)" in result.stdout
    assert "{" not in result.stdout and "'policy'" not in result.stdout, result.stdout


def replace_model_name(profile: dr.Profile, name: str) -> dr.Profile:
    from dataclasses import replace

    return replace(profile, model=replace(profile.model, name_or_path=name))


def test_validate_exit_codes(tmp_path):
    path = dr.save_profile(random_profile(), tmp_path / "p.json")
    assert runner.invoke(app, ["profiles", "validate", str(path)]).exit_code == 0
    data = json.loads(path.read_text())
    data["scores"][0][0] = 7
    path.write_text(json.dumps(data))
    result = runner.invoke(app, ["profiles", "validate", str(path)])
    assert result.exit_code == 1 and "outside [0, 1]" in result.stderr


def test_validate_against_model_config(tmp_path):
    path = dr.save_profile(random_profile(layers=4, kv_heads=2, heads=4, head_dim=8), tmp_path / "p.json")
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 3,
                "hidden_size": 32,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
            }
        )
    )
    result = runner.invoke(app, ["profiles", "validate", str(path), "--model-config", str(cfg)])
    assert result.exit_code == 1 and "3 layers x 2 KV heads" in result.stderr


def test_import_and_export_upstream(tmp_path):
    folder = write_pattern(tmp_path / "pat", np.random.default_rng(0).uniform(0, 1, (32, 8)))
    out = tmp_path / "p.json"
    result = runner.invoke(app, ["profiles", "import-upstream", str(folder), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert dr.load_profile(out).shape.num_key_value_heads == 8
    result = runner.invoke(app, ["profiles", "export-upstream", str(out), "-o", str(tmp_path / "exp")])
    assert result.exit_code == 0, result.output
    assert dr.import_upstream(tmp_path / "exp").scores == dr.load_profile(out).scores
    bad = runner.invoke(app, ["profiles", "import-upstream", str(tmp_path), "-o", str(tmp_path / "x.json")])
    assert bad.exit_code == 1 and "missing" in bad.stderr and not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("name", ["full_attention_heads.tsv", "config.json"])
def test_import_upstream_refuses_to_write_over_its_own_input_before_reading_it(tmp_path, name):
    folder = write_pattern(tmp_path / "pat", np.random.default_rng(0).uniform(0, 1, (32, 8)))
    before = (folder / name).read_bytes()
    result = runner.invoke(app, ["profiles", "import-upstream", str(folder), "-o", str(folder / name)])
    assert result.exit_code == 1 and "being read" in result.stderr
    assert (folder / name).read_bytes() == before


def test_an_unwritable_output_is_refused_before_any_work(tmp_path, monkeypatch):
    folder = write_pattern(tmp_path / "pat", np.random.default_rng(0).uniform(0, 1, (32, 8)))
    (tmp_path / "a-file").write_text("")
    calls = []
    monkeypatch.setattr(dr, "import_upstream", lambda *a, **k: calls.append(a))
    result = runner.invoke(app, ["profiles", "import-upstream", str(folder), "-o", str(tmp_path / "a-file" / "p.json")])
    assert result.exit_code == 1 and "a-file is a file, not a folder" in result.stderr
    assert not calls  # nothing was read or converted first


def test_profile_help_names_the_format_version_the_profiler_writes():
    from duocal_runtime.profile.format import VERSION

    written = random_profile().to_dict()["version"]
    assert written == VERSION
    result = runner.invoke(app, ["profile", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert f"format version {written}" in result.stdout and "version 2" not in result.stdout

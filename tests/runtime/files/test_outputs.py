"""Outputs are all-or-nothing and readable: atomic files get the umask's mode, multi-file outputs
replace the old ones together or not at all, and a plot never fails a finished evaluation."""

import json
import os
import stat

import pytest
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.cli.app import app
from duocal.eval.passkey_retrieval import PasskeyRow
from duocal.eval.tables import plot_rows
from duocal_runtime.files.atomic import write_atomic, write_files_atomic

from helpers.profiles import random_profile


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_atomic_files_and_folders_get_the_umask_mode(tmp_path, umask_022):
    assert mode(write_atomic(tmp_path / "a.json", "{}")) == 0o644
    folder = write_files_atomic(tmp_path / "pattern", {"x.tsv": "1\n", "config.json": "{}"})
    assert mode(folder) == 0o755 and mode(folder / "x.tsv") == 0o644
    saved = dr.save_profile(random_profile(), tmp_path / "profile.json")
    assert mode(saved) == 0o644


@pytest.mark.parametrize("kept", [0o600, 0o444, 0o640])
def test_a_replaced_file_keeps_its_mode(tmp_path, umask_022, kept):
    for path, write in [
        (tmp_path / "a.json", lambda p: write_atomic(p, "{}")),
        (tmp_path / "profile.json", lambda p: dr.save_profile(random_profile(), p)),
        (tmp_path / "pattern" / "x.tsv", lambda p: write_files_atomic(p.parent, {"x.tsv": "2\n"})),
    ]:
        path.parent.mkdir(exist_ok=True)
        path.write_text("old")
        path.chmod(kept)
        write(path)
        assert mode(path) == kept and path.read_text() != "old", path


def test_export_upstream_onto_a_broken_folder_changes_nothing(tmp_path):
    out = tmp_path / "pattern"
    (out / "config.json").mkdir(parents=True)
    (out / "full_attention_heads.tsv").write_text("old\n")
    profile = tmp_path / "p.json"
    dr.save_profile(random_profile(), profile)
    result = CliRunner().invoke(app, ["profiles", "export-upstream", str(profile), "-o", str(out)])
    assert result.exit_code == 1 and result.output.startswith("error:") and "Traceback" not in result.output
    assert (out / "full_attention_heads.tsv").read_text() == "old\n" and (out / "config.json").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.json", "pattern"]  # no staging folder left


def row(policy, em, lo=None, hi=None):
    return PasskeyRow(
        row=policy,
        context=512,
        sparsity=0.5,
        exact_match=em,
        kv_bytes=1000,
        kv_bytes_measured=1000,
        kv_bytes_full=2000,
        fraction_of_full=0.5,
        samples=20,
        bounded_heads=8,
        num_heads=16,
        head_policy=None,
        seconds=1.0,
        min=lo,
        max=hi,
    )


def test_plot_survives_a_mean_above_its_max_by_rounding(tmp_path):
    rows = [row("full", 1.0), row("random", 0.05000000000000001, 0.05, 0.05)]
    assert plot_rows(rows, tmp_path / "p.png").stat().st_size > 0


@pytest.mark.parametrize("plot,message", [("out.xyz", "ending in .png"), (".", "is a folder")])
def test_a_plot_that_cannot_be_written_is_refused_before_any_work(tmp_path, plot, message):
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "passkey",
            "--rows",
            "full",
            "--contexts",
            "64",
            "--samples",
            "1",
            "--plot",
            str(tmp_path / plot) if plot != "." else str(tmp_path),
        ],
    )
    assert result.exit_code == 1 and result.output.startswith("error:") and message in result.output


def test_json_writes_no_plot_unless_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        app, ["eval", "passkey", "--rows", "full", "--contexts", "64", "--samples", "2", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["row"] == "full"
    assert list(tmp_path.iterdir()) == []

"""With --json, stdout is the JSON document alone, on an empty cache too: everything else printed
while the command works (other libraries' logs, progress) goes to stderr."""

import json
import sys
from importlib import resources

import pytest
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.cli import app
from duocal.models.known import DEMO_MODEL_DIR
from duocal.models.resolve import ModelRef

from helpers.profiles import random_profile

runner = CliRunner()
TEXT = resources.files("duocal") / "assets" / "texts" / "gpl-3.0.txt"


@pytest.fixture
def noisy_loading(monkeypatch, tmp_path):
    """An empty cache, and a model load that prints to stdout as DeepSpeed's accelerator log did."""
    monkeypatch.setenv("DUOCAL_CACHE_DIR", str(tmp_path / "cache"))
    load = ModelRef.load_model

    def noisy(self):
        print("[WARNING] [real_accelerator.py:213:get_accelerator] Setting accelerator to CPU")
        sys.stdout.write("more noise\n")
        return load(self)

    monkeypatch.setattr(ModelRef, "load_model", noisy)


def commands(tmp_path):
    other = dr.save_profile(random_profile(layers=4, kv_heads=4, heads=8, head_dim=16, seed=3), tmp_path / "o.json")
    return [
        ["eval", "passkey", "--contexts", "256", "--samples", "1", "--rows", "full", "--json"],
        ["eval", "ppl", "--context", "256", "--text-windows", "1", "--rows", "full", "--json"],
        ["models", "list", "--json"],
        ["profiles", "list", "--json"],
        ["profiles", "show", "demo-model", "--json"],
        ["profiles", "compare", "demo-model", str(other), "--json"],
        ["recipes", "list", "--json"],
        [
            "tune",
            str(DEMO_MODEL_DIR),
            "--data",
            str(TEXT),
            "--context",
            "128",
            "--samples",
            "1",
            "--sparsities",
            "0.5",
            "--output",
            str(tmp_path / "tuned.json"),
            "--json",
        ],
    ]


def test_every_json_command_prints_only_json_on_stdout(noisy_loading, tmp_path):
    for args in commands(tmp_path):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, (args, result.output)
        json.loads(result.stdout)  # the whole of stdout, nothing before or after
        if args[0] in ("eval", "tune"):
            assert "Setting accelerator to CPU" in result.stderr  # moved, not lost


def test_ctrl_c_during_the_command_lines_own_imports_is_one_line_and_exit_130(monkeypatch, capsys):
    import types

    from duocal.__main__ import main

    class Interrupting(types.ModuleType):
        def __getattr__(self, name):
            raise KeyboardInterrupt  # as if Ctrl-C came while `duocal.cli` was importing

    monkeypatch.setitem(sys.modules, "duocal.cli", Interrupting("duocal.cli"))
    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == 130 and capsys.readouterr().err == "interrupted\n"


def test_ctrl_c_inside_a_command_is_exit_130_without_a_traceback():
    import os
    import signal
    import subprocess
    import time

    script = os.path.join(os.path.dirname(sys.executable), "duocal")
    # a test run in the background inherits SIGINT ignored: the command gets it as a terminal would give it
    process = subprocess.Popen(
        [script, "eval", "ppl", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(1.5)  # past the interpreter's start, inside the imports of torch and transformers or later
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "Traceback" not in err and out == ""


def test_the_profiler_refuses_contexts_beyond_the_models_positions_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setattr(ModelRef, "load_model", lambda self: pytest.fail("loaded the weights"))
    result = runner.invoke(app, ["profile", "--contexts", "1024,5000", "--output", str(tmp_path / "p.json")])
    assert (
        result.exit_code == 1 and "context 5000 is beyond the model's max_position_embeddings (4096)" in result.stderr
    )
    assert not (tmp_path / "p.json").exists()


def test_evaluations_print_each_row_on_stderr_as_it_finishes_and_keep_stdout_for_results():
    result = runner.invoke(
        app, ["eval", "ppl", "--context", "256", "--text-windows", "1", "--rows", "full,streaming", "--json"]
    )
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)
    assert "full: ppl" in result.stderr and "streaming: ppl" in result.stderr

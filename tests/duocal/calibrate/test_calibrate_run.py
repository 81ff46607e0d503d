"""`duocal calibrate` end to end on a tiny random Llama: outputs, resume after a kill, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.calibrate.batches import StepData, make_generator
from duocal.calibrate.recipe import load_recipe, load_resolved
from duocal.calibrate.run import lr_factor
from duocal.cli.app import app

from helpers.models import save_tiny_model

QUICK = [
    "data.context=[64,128]",
    "data.num_passkeys=[1,2]",
    "attention.sink=4",
    "attention.recent=16",
    "attention.block=16",
    "ranking.method=gates",
]


def run_cli(*args: str):
    return CliRunner().invoke(app, ["calibrate", *args])


def upstream_lr_factor(step: int, n: int) -> float:
    """DuoAttention's schedule as upstream writes it: a 20% linear warm-up and decay, floored at 0.1."""
    return min(1, max((step + 1) / (n // 5), 0.1), max((n - step) / (n // 5), 0.1))


def test_schedule_is_upstreams():
    for n in (5, 100, 2000):
        assert [lr_factor(s, n) for s in range(n)] == pytest.approx([upstream_lr_factor(s, n) for s in range(n)])
    assert lr_factor(0, 1) == 1.0


def test_step_data_shares_and_scales(tiny_llama_folder):
    recipe = load_recipe(None, [f"model.name_or_path={tiny_llama_folder}", *QUICK])
    from transformers import AutoTokenizer

    gen = make_generator(recipe.data, AutoTokenizer.from_pretrained(tiny_llama_folder))
    one = StepData(gen, 0, batch_size=4, micro_batch_size=2, world_size=1)
    two = [StepData(gen, 0, batch_size=4, micro_batch_size=1, world_size=2).micro_batches(3, r) for r in (0, 1)]
    sp = [
        StepData(gen, 0, batch_size=4, micro_batch_size=4, world_size=2, sequence_parallel=True).micro_batches(3, r)
        for r in (0, 1)
    ]
    samples = one.samples(3)
    assert samples[0].input_ids == gen[12].input_ids  # step 3, batch 4: samples 12..15
    answers = sum(len(s.predict_positions) for s in samples)
    for layout, world, acc in ((one.micro_batches(3, 0), 1, 2), ((*two[0], *two[1]), 2, 2), ((*sp[0], *sp[1]), 2, 1)):
        # every answer position is counted once, and the scales make DeepSpeed's mean the global mean
        assert sum(int(m.positions.sum()) for m in layout) == answers
        assert sum(int(m.positions.sum()) * m.scale for m in layout) / (world * acc) == pytest.approx(1.0)
    full = torch.cat([sp[0][0].input_ids, sp[1][0].input_ids], dim=1)
    assert full[0, : len(samples[0])].tolist() == list(samples[0].input_ids)
    assert sp[1][0].position_ids[0, 0] == sp[0][0].input_ids.shape[1]  # original positions


def test_calibrate_writes_profile_heatmap_metrics_config(tiny_llama_folder, tmp_path):
    out = tmp_path / "run"
    result = run_cli(
        f"model.name_or_path={tiny_llama_folder}",
        *QUICK,
        "train.steps=3",
        "train.batch_size=2",
        "checkpoint.every=2",
        "--output",
        str(out),
    )
    assert result.exit_code == 0, result.output
    assert f"profile written to {out / 'profile.json'}" in result.output
    profile = dr.load_profile(str(out / "profile.json"))
    assert profile.shape == dr.ModelShape(2, 4, 2, 8)
    assert all(0.0 <= s <= 1.0 for s in profile.flat_scores())
    assert profile.source["kind"] == "calibration" and profile.source["final"]["step"] == 3
    assert profile.source["recipe"]["train"]["steps"] == 3
    assert profile.source["recipe"]["deepspeed"]["config"] == "recipes/deepspeed/cpu.json"  # no absolute paths
    assert profile.deploy.sink_window == dr.SinkWindow(16, 64)  # the recipe's deploy sizes
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    assert set(lines[0]) == {"step", "distill_loss", "reg_loss", "lr", "tokens", "seconds"}
    assert lines[0]["reg_loss"] == pytest.approx(1.0)  # gates start at 1
    assert (out / "gates.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    resolved = load_resolved(out / "config.yaml")
    assert resolved.train.steps == 3 and resolved.model.name_or_path == str(tiny_llama_folder)
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["step"] == 2
    again = run_cli(f"model.name_or_path={tiny_llama_folder}", *QUICK, "--output", str(out))
    assert again.exit_code == 1 and "already holds a calibration run" in again.output


def _cli_process(*args: str) -> subprocess.Popen:
    code = "from duocal.cli.app import app; app()"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", code, "calibrate", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow
def test_resume_after_kill_reaches_the_same_gates(tiny_llama_folder, tmp_path):
    common = [f"model.name_or_path={tiny_llama_folder}", *QUICK, "train.steps=24", "checkpoint.every=3"]
    killed = tmp_path / "killed"
    proc = _cli_process(*common, "--output", str(killed))
    latest = killed / "checkpoints" / "latest.json"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if latest.is_file() and json.loads(latest.read_text())["step"] >= 6:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.communicate()[0][-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "profile.json").exists()
    resumed = _cli_process("--output", str(killed), "--resume")
    whole = _cli_process(*common, "--output", str(tmp_path / "whole"))
    for p in (resumed, whole):
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out[-3000:]
    a = json.loads((killed / "profile.json").read_text())["source"]["gates"]
    b = json.loads((tmp_path / "whole" / "profile.json").read_text())["source"]["gates"]
    assert a == b
    steps = [json.loads(line)["step"] for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 25))  # the steps redone after the checkpoint are logged once


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["train.stepz=3"], "unknown recipe key train.stepz"),
        (["data.context=[64,100000]"], "max_position_embeddings"),
        (["data.context=[20,30]", "data.num_passkeys=6"], "raise context_length or lower num_passkeys"),
        (["deepspeed.zero_stage=4"], "deepspeed.zero_stage: Input should be 0, 1, 2 or 3"),
        (["train.batch_size=3", "train.micro_batch_size=2"], "multiple of train.micro_batch_size"),
    ],
)
def test_bad_input_fails_before_any_work(tiny_llama_folder, tmp_path, overrides, message):
    out = tmp_path / "run"
    result = run_cli(f"model.name_or_path={tiny_llama_folder}", *QUICK, *overrides, "--output", str(out))
    assert result.exit_code == 1
    assert message in result.output
    assert not (out / "config.yaml").exists() and not (out / "checkpoints").exists()


def test_unsupported_model_and_missing_resume(tmp_path):
    gpt2 = save_tiny_model(tmp_path / "gpt2", "gpt2")
    result = run_cli(f"model.name_or_path={gpt2}", *QUICK, "--output", str(tmp_path / "run"))
    assert result.exit_code == 1 and "does not support model type 'gpt2'" in result.output
    result = run_cli("--output", str(tmp_path / "nothing"), "--resume")
    assert result.exit_code == 1 and "nothing to resume" in result.output
    result = run_cli("no_such_recipe", "--output", str(tmp_path / "x"))
    assert result.exit_code == 1 and "neither a file nor a shipped recipe" in result.output

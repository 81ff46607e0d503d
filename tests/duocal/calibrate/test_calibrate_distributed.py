"""Two processes on CPU (gloo) give the gates of one: ZeRO-3 data parallel, and Ulysses sequence parallel."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_calibrate_run import QUICK

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def calibrate(out, *args, nproc=1, launcher="torchrun"):
    code = "from duocal.cli.app import app; app()"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "calibrate",
            *args,
            "--output",
            str(out),
            "--nproc",
            str(nproc),
            "--launcher",
            launcher,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    profile = json.loads((out / "profile.json").read_text())
    losses = [json.loads(line)["distill_loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    return profile, losses


def close(a, b, tol=1e-5):
    flat = lambda m: [x for row in m for x in row]  # noqa: E731
    return max(abs(x - y) for x, y in zip(flat(a), flat(b), strict=True)) <= tol


def test_zero3_on_two_processes_gives_the_gates_of_one(tiny_llama_folder, tmp_path):
    common = [
        f"model.name_or_path={tiny_llama_folder}",
        *QUICK,
        "train.steps=4",
        "train.batch_size=2",
        "checkpoint.every=0",
        "ranking.method=measured",
        "ranking.samples=2",
    ]
    one, losses_one = calibrate(tmp_path / "one", *common)
    two, losses_two = calibrate(tmp_path / "two", *common, "deepspeed.zero_stage=3", nproc=2)
    assert close(one["source"]["gates"], two["source"]["gates"]), (one["source"]["gates"], two["source"]["gates"])
    assert losses_one == pytest.approx(losses_two, rel=1e-4, abs=1e-9)
    assert any(g != 1.0 for row in one["source"]["gates"] for g in row)  # the gates did train
    # the measured ranking runs collectively on the sharded model and agrees too
    assert one["source"]["ranking"]["order"] == two["source"]["ranking"]["order"]
    assert close(one["scores"], two["scores"])


def test_ulysses_on_two_processes_gives_the_gates_of_one(tiny_llama_folder, tmp_path):
    common = [
        f"model.name_or_path={tiny_llama_folder}",
        *QUICK,
        "train.steps=3",
        "checkpoint.every=0",
        "data.context=[150,190]",  # longer than sink + recent: the blocked path runs
        "ranking.method=measured",
        "ranking.samples=2",
        "ranking.max_candidates=4",
    ]
    one, losses_one = calibrate(tmp_path / "one", *common)
    two, losses_two = calibrate(
        tmp_path / "two", *common, "deepspeed.sequence_parallel=2", nproc=2, launcher="deepspeed"
    )  # the DeepSpeed launcher (torchrun: the ZeRO-3 test)
    assert close(one["source"]["gates"], two["source"]["gates"]), (one["source"]["gates"], two["source"]["gates"])
    assert losses_one == pytest.approx(losses_two, rel=1e-4, abs=1e-9)
    assert one["source"]["ranking"]["order"] == two["source"]["ranking"]["order"]

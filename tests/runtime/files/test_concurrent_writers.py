"""Two writers on one output folder: the second is refused with the first one's pid, and nothing of
theirs is mixed; two fetches of one model: the second waits and uses the first one's folder."""

import os
import subprocess
import sys
import threading
import time

import pytest

from duocal_runtime.files.file_lock import FolderBusyError, exclusive


def test_a_second_writer_of_a_folder_is_refused_while_the_first_holds_it(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time\n"
                "from duocal_runtime.files.file_lock import exclusive\n"
                f"with exclusive({str(tmp_path)!r}, 'test'):\n"
                "    print('held', flush=True); time.sleep(30)\n"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderBusyError, match=rf"in use by pid {holder.pid}"):
            with exclusive(tmp_path, "second"):
                pass
    finally:
        holder.kill()
        holder.wait()
    with exclusive(tmp_path, "after"):  # a killed holder leaves no stale lock
        pass


def test_two_calibrations_into_one_folder_do_not_both_run(tmp_path):
    """The second `duocal calibrate` into the folder the first is writing fails at once, saying so."""
    cmd = [sys.executable, "-m", "duocal", "calibrate", "train.steps=40", "--output", str(tmp_path / "run")]
    first = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    try:
        deadline = time.perf_counter() + 60
        while not (tmp_path / "run" / "config.yaml").exists() and time.perf_counter() < deadline:
            time.sleep(0.1)
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert second.returncode == 1
        assert second.stderr.startswith("error: ") and "in use by pid" in second.stderr
    finally:
        first.kill()
        first.wait()


def test_waiting_writers_take_turns(tmp_path):
    order = []

    def write(name):
        with exclusive(tmp_path, name, wait=True):
            order.append((name, "in"))
            time.sleep(0.3)
            order.append((name, "out"))

    threads = [threading.Thread(target=write, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [step for _, step in order] == ["in", "out", "in", "out"]  # never both inside

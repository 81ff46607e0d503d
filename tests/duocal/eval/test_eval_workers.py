"""Evaluation jobs on forked workers: every job once, results in job order, progress in the parent."""

import os

import pytest
import torch

from duocal.eval.ruler import RulerConfig
from duocal.eval.workers import default_workers, run_jobs, workers_for


def square_with_pid(i: int) -> tuple[int, int]:
    if i == 7:
        raise ValueError("job 7 fails")
    return i * i, os.getpid()


@pytest.mark.parametrize("workers", [1, 2])
def test_jobs_run_once_each_in_order_and_report_in_this_process(workers):
    seen = []
    results = run_jobs(6, square_with_pid, workers, lambda i, r: seen.append((i, r, os.getpid())))
    assert [r[0] for r in results] == [i * i for i in range(6)]
    assert sorted(i for i, _, _ in seen) == list(range(6)) and all(pid == os.getpid() for *_, pid in seen)
    pids = {r[1] for r in results}
    assert (pids == {os.getpid()}) if workers == 1 else (os.getpid() not in pids)


def test_a_failing_job_fails_the_run_with_its_error():
    for workers in (1, 2):
        with pytest.raises(ValueError, match="job 7 fails"):
            run_jobs(9, square_with_pid, workers, lambda i, r: None)


def test_worker_counts():
    assert workers_for(None, torch.device("cpu")) == default_workers(torch.device("cpu")) >= 1
    assert workers_for(None, torch.device("cuda")) == 1 and workers_for(1, torch.device("cuda")) == 1
    with pytest.raises(ValueError, match="only works on a CPU"):
        workers_for(2, torch.device("cuda"))
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="whole number of at least 1"):
            RulerConfig(workers=bad)

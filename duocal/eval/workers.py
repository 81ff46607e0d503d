"""An evaluation's jobs on forked worker processes of one thread each, or in this process.

On a CPU, processes of one thread each run generations faster than one process with as many
threads (measured on 2 cores, SmolLM2-135M, a 4k-token prefill and 48 new tokens per document:
two documents in 27 s on two processes against 35 s on one process of two threads): small ops
and the decode steps do not split well over threads. Workers are forked after the model is
loaded and the documents are built, so they share both (copy-on-write) and load nothing again;
each job's results come back to this process, which alone reports progress. Forking is for
CPUs only: a process that has used CUDA cannot fork usable children, so the default there is 1.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

_WORK: Callable[[int], Any] | None = None  # what a forked worker runs (inherited at fork)


def default_workers(device: torch.device) -> int:
    """The CPU cores this process may use on a CPU; 1 on any other device."""
    if device.type != "cpu":
        return 1
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def check_worker_count(workers: int | None) -> None:
    """A clear error unless `workers` is None (the default) or a whole number of at least 1."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a whole number of at least 1, got {workers!r}")


def workers_for(workers: int | None, device: torch.device) -> int:
    """How many workers run on `device` (None: `default_workers`); more than 1 off a CPU is an error."""
    check_worker_count(workers)
    if workers is None:
        return default_workers(device)
    if workers > 1 and device.type != "cpu":
        raise ValueError(f"workers above 1 fork processes, which only works on a CPU (the model is on {device})")
    return workers


def _one_thread() -> None:
    torch.set_num_threads(1)


def _run(index: int) -> tuple[int, Any]:
    assert _WORK is not None
    return index, _WORK(index)


def run_jobs(count: int, work: Callable[[int], Any], workers: int, done: Callable[[int, Any], None]) -> Sequence[Any]:
    """`work(i)` for every i < count, on `workers` forked processes (or here, for 1); `done(i, result)`
    runs in this process as each job finishes. Returns the results in job order."""
    global _WORK
    results: list[Any] = [None] * count
    if workers <= 1 or count <= 1:
        for i in range(count):
            results[i] = work(i)
            done(i, results[i])
        return results
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the tokenizer's own threads do not survive a fork
    _WORK = work
    try:
        with multiprocessing.get_context("fork").Pool(min(workers, count), initializer=_one_thread) as pool:
            for i, result in pool.imap_unordered(_run, range(count)):
                results[i] = result
                done(i, result)
    finally:
        _WORK = None
    return results

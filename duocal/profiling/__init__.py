"""Training-free head profiling: per-head scores and kept-attention measurements from a model's own
attention (`duocal profile`), written as a profile with measurements for mixed plans under a budget.

Names load on first use (PEP 562): the seed below imports without the profiler's machinery."""

from __future__ import annotations

import importlib
from typing import Any

PROFILER_SEED = 4242  # the profiler's default sample seed: not among calibration's or evaluation's defaults

_LAZY = ("ProfilerConfig", "profile_model", "with_measurements")  # from duocal.profiling.profiler
__all__ = ["PROFILER_SEED", *_LAZY]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("duocal.profiling.profiler"), name)
    globals()[name] = value
    return value

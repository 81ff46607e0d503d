"""Checks of the public API's arguments at the call: `TypeError` / `ValueError` naming the
argument and saying what to pass, instead of an AttributeError from deep inside."""

from __future__ import annotations

import math
import os
from numbers import Integral, Real
from typing import Any


def require_instance(name: str, value: Any, cls: type | tuple[type, ...], hint: str) -> None:
    if not isinstance(value, cls):
        raise TypeError(f"{name} must be {hint}, got {type(value).__name__} {value!r:.80}")


def require_number(name: str, value: Any, lo: float | None = None, hi: float | None = None) -> float:
    """A finite real number (not a bool, not a string) in [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r:.80}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(
            f"{name} must be in [{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}], got {value!r}"
        )
    return float(value)


def require_count(name: str, value: Any, minimum: int = 0) -> int:
    """An integer (numpy's too; not a bool, not a float or string) >= minimum, as a Python int."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r:.80}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def require_reference(name: str, value: Any) -> None:
    """A profile reference: a path or a non-empty string (name, URL, hf://)."""
    if isinstance(value, os.PathLike):
        return
    if not isinstance(value, str):
        raise TypeError(
            f"{name} must be a path, a prebuilt name, a URL or hf://OWNER/REPO, got "
            f"{type(value).__name__} {value!r:.80}"
        )
    if not value.strip():
        raise ValueError(f"{name} is empty: give a profile file, a pattern folder, a prebuilt name or a URL")

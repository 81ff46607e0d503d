"""How two profiles of one model agree on which heads matter: Spearman's rank correlation of
their scores and the overlap of their top heads (`duocal profiles compare A B`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import duocal_runtime as dr
from duocal_runtime.planning.head_order import bounded_order


def average_ranks(values: Sequence[float]) -> list[float]:
    """Ranks 1..n, ties sharing the mean of their ranks (as Spearman's rho needs)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (Pearson's r of the average ranks); 0 when either is constant."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError("spearman needs two sequences of the same length, at least 2")
    ra, rb = average_ranks(a), average_ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    var_a, var_b = sum((x - ma) ** 2 for x in ra), sum((y - mb) ** 2 for y in rb)
    return cov / (var_a * var_b) ** 0.5 if var_a and var_b else 0.0


def compare_profiles(a: dr.Profile, b: dr.Profile, top: int | None = None) -> dict[str, Any]:
    """Rank agreement of two profiles of the same model shape."""
    if a.shape != b.shape:
        raise ValueError(f"the profiles are for different shapes: {a.shape.describe()} and {b.shape.describe()}")
    fa, fb = a.flat_scores(), b.flat_scores()
    if top is not None and not 1 <= top <= len(fa):
        raise ValueError(f"--top must be between 1 and the {len(fa)} heads, got {top}")
    top = top or max(1, len(fa) // 4)
    best = lambda f: set(bounded_order(f)[::-1][:top])  # noqa: E731
    return {
        "heads": len(fa),
        "spearman": round(spearman(fa, fb), 4),
        "top": top,
        "top_overlap": len(best(fa) & best(fb)),
    }

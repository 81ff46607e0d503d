"""The order in which heads stop being full: ascending score, ties broken by what the profile measured.

Upstream DuoAttention sorts heads by gate and breaks ties with random noise. Calibrated gates are
clamped to [0, 1], so many heads tie at 0 (SmolLM2's calibrated profile: 49 of 90 gates are 0.0 and
60 are below 1e-3), and which of them stay full is then decided by the tie-break alone. With a
measured loss per head (`losses`: 1 − the share of attention the plan's policy keeps, from the
profile's `kept:<policy>` measurement), scores within `TIE` of the first of their run are tied and
the head that loses least goes first. Without measurements, only equal scores tie, and the later
flat index (layer × KV heads + head) goes first (the earlier layers keep their full cache), as before.
"""

from __future__ import annotations

from collections.abc import Sequence

TIE = 1e-3  # measured: SmolLM2's zero-clamped gates spread up to 6e-4; distinct gates are >= 1e-3 apart


def tie_runs(flat_scores: Sequence[float], tolerance: float) -> list[list[int]]:
    """Heads in ascending score, cut into runs whose scores are within `tolerance` of the run's first."""
    runs: list[list[int]] = []
    for i in sorted(range(len(flat_scores)), key=lambda i: (flat_scores[i], -i)):
        if runs and flat_scores[i] - flat_scores[runs[-1][0]] <= tolerance:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def bounded_order(flat_scores: Sequence[float], losses: Sequence[float] | None = None) -> list[int]:
    """Flat head indices in the order they become bounded (see the module docstring)."""
    if losses is None:
        return sorted(range(len(flat_scores)), key=lambda i: (flat_scores[i], -i))
    return [i for run in tie_runs(flat_scores, TIE) for i in sorted(run, key=lambda i: (losses[i], -i))]


def decided_by_ties(flat_scores: Sequence[float], count: int, measured: bool) -> int:
    """How many of the first `count` bounded heads were chosen among tied heads (a run the cut splits)."""
    taken = 0
    for run in tie_runs(flat_scores, TIE if measured else 0.0):
        if taken + len(run) > count:
            return count - taken if taken < count else 0
        taken += len(run)
    return 0


def tie_losses(profile, policy) -> list[float] | None:
    """1 − kept share of `policy` per head, when the profile measured that policy (else None)."""
    measured = profile.measurements.get(f"kept:{policy.name}")
    return None if measured is None else [1.0 - k for k in measured.flat()]

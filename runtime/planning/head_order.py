"""Which heads stop being full: how many (a sparsity) or which (a threshold), in the order they do:
ascending score; only equal scores tie.

Upstream DuoAttention sorts heads by gate and breaks ties with random noise. Calibrated gates are
clamped to [0, 1], so many heads tie exactly at 0 (SmolLM2's calibrated profile: 49 of 90 gates are
0.0) or 1, and which of them stay full is then decided by the tie-break alone. Here a tie is an
exact tie: a head with a larger score is never bounded before a head with a smaller one, however
small the difference. (An earlier rule tied every score within 1e-3 of a run's first and let the
tie-break decide among them; on SmolLM2 that bounded small non-zero gates of retrieval heads in
layers 14-18 (5e-5..4e-4) while zero-gate heads stayed full, and garbled chat answers at 50%.
The shipped profiles hold no near-equal distinct scores that a tolerance would have to merge: their
smallest relative gap between distinct scores is 1e-4, 0.9999 against 1.0.)

Among equal scores, with a measured loss per head (`losses`: 1 − the share of attention the plan's
policy keeps, from the profile's `kept:<policy>` measurement) the head that loses least goes first;
without measurements, or among equal losses, the later flat index (layer × KV heads + head) goes
first (the earlier layers keep their full cache), as before.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from ..checks import require_number
from ..errors import ConflictingArgumentsError


def bounded_order(flat_scores: Sequence[float], losses: Sequence[float] | None = None) -> list[int]:
    """Flat head indices in the order they become bounded (see the module docstring)."""
    tie_break = losses if losses is not None else [0.0] * len(flat_scores)
    return sorted(range(len(flat_scores)), key=lambda i: (flat_scores[i], tie_break[i], -i))


def tied_at_cut(flat_scores: Sequence[float], bounded: Collection[int]) -> tuple[int, int]:
    """(bounded heads that share their score with a full head, all heads with such a score): the heads
    a tie-break chose, and how many it chose among. (0, 0) when no score is on both sides of the cut."""
    bounded = set(bounded)
    bounded_scores = {flat_scores[i] for i in bounded}
    full_scores = {s for i, s in enumerate(flat_scores) if i not in bounded}
    split = bounded_scores & full_scores
    chosen = sum(1 for i in bounded if flat_scores[i] in split)
    return chosen, sum(1 for s in flat_scores if s in split)


def tie_losses(profile, policy) -> list[float] | None:
    """1 − kept share of `policy` per head, when the profile measured that policy (else None)."""
    measured = profile.measurements.get(f"kept:{policy.name}")
    return None if measured is None else [1.0 - k for k in measured.flat()]


def check_head_choice(sparsity=None, threshold=None, budget=None) -> None:
    """How a plan chooses its bounded heads, checked for `plan` and for tools that check their options
    before they load a model: `sparsity` in [0, 1], `threshold` a finite number, at most one of the three."""
    for name, value, lo, hi in (("sparsity", sparsity, 0, 1), ("threshold", threshold, None, None)):
        if value is not None:
            require_number(name, value, lo, hi)
    given = tuple(
        name for name, v in (("sparsity", sparsity), ("threshold", threshold), ("budget", budget)) if v is not None
    )
    if len(given) > 1:
        raise ConflictingArgumentsError(f"give one of sparsity, threshold or budget, not {' and '.join(given)}", given)


def bounded_head_count(num_heads: int, sparsity: float) -> int:
    """KV heads made bounded at `sparsity`: round(sparsity * heads) (Python's round: halves to even)."""
    check_head_choice(sparsity=sparsity)
    return round(sparsity * num_heads)


def bounded_heads_for_sparsity(flat_scores: Sequence[float], sparsity: float, losses=None) -> set[int]:
    """Exactly `bounded_head_count` heads, lowest scores first (ties: planning/head_order.py)."""
    return set(bounded_order(flat_scores, losses)[: bounded_head_count(len(flat_scores), sparsity)])


def bounded_heads_for_threshold(flat_scores: Sequence[float], threshold: float) -> set[int]:
    """Heads with score below `threshold` (upstream: score >= threshold stays full)."""
    return {i for i, s in enumerate(flat_scores) if s < threshold}

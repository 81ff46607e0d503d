"""The `loss` score measured at a target sparsity (`duocal profile --loss-at-sparsity S`).

At g = 1 the loss score asks what streaming one head costs when every other head is full. At a high
sparsity most heads are bounded, and which heads matter then can differ. Here the gates sit at the
hard values of the plan for S (1: kept full, 0: bounded; measure/answer_loss.py): a bounded head's score
is the first-order gain of keeping it full with the others as the plan has them, a full head's the
first-order cost of bounding it. The first plan comes from the g = 1 ranking; each round scores at
the current plan and re-plans from those scores, until a plan comes back (converged, or a cycle) or
`rounds` have run. The profile's scores are the last round's, and it deploys at S: its order below
the plan's cut was not measured for other sparsities (on SmolLM2, ranked at 0.75, it garbled chat
answers at 0.5).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import duocal_runtime as dr
from duocal.measure.answer_loss import plan_point, streaming_loss
from duocal_runtime.planning.head_order import bounded_heads_for_sparsity

ROUNDS = 4  # rounds at the plan's point after the g = 1 pass (SmolLM2 settles in fewer)


@dataclass(frozen=True)
class RankedAtPlan:
    sparsity: float
    scores: torch.Tensor  # [L, G]: −∂L/∂g at the last round's plan
    bounded: frozenset[int]  # the plan those scores were measured at (flat indices)
    rounds: int  # rounds at a plan's point (the g = 1 pass not counted)
    settled: bool  # the last round's scores plan the heads it was measured at (a fixed point)

    @property
    def source(self) -> dict:
        """What the profile's source records of the ranking."""
        return {"loss_at_sparsity": self.sparsity, "rounds": self.rounds, "settled": self.settled}


def check_loss_at_sparsity(sparsity: float | None, score: str) -> None:
    """A target sparsity strictly between 0 and 1, for the loss score only (None: the g = 1 score)."""
    if sparsity is None:
        return
    if score != "loss":
        raise ValueError(f"--loss-at-sparsity ranks heads by the loss score; the score here is {score}")
    if isinstance(sparsity, bool) or not isinstance(sparsity, int | float) or not 0 < sparsity < 1:
        raise ValueError(f"--loss-at-sparsity must be between 0 and 1 (exclusive), got {sparsity!r}")


def bounded_at(scores: torch.Tensor, sparsity: float) -> frozenset[int]:
    """The heads `dr.plan` bounds at `sparsity` when it ranks by `scores` (no measured ties)."""
    return frozenset(bounded_heads_for_sparsity(scores.flatten().tolist(), sparsity))


def loss_at_sparsity(
    model, pairs, sink_window: dr.SinkWindow, sparsity: float, report, rounds: int = ROUNDS
) -> RankedAtPlan:
    """Score `pairs` (token ids, answer rows) at g = 1, then at the plan for `sparsity` for up to
    `rounds` rounds (module docstring); `report(done, total)` counts sequences over every pass."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    total = len(pairs) * (rounds + 1)
    scores = streaming_loss(model, pairs, sink_window, lambda done: report(done, total))
    seen: list[frozenset[int]] = []
    bounded = bounded_at(scores, sparsity)
    while bounded not in seen and len(seen) < rounds:
        seen.append(bounded)
        done = len(pairs) * len(seen)
        at = plan_point(scores.shape, set(bounded))
        scores = streaming_loss(model, pairs, sink_window, lambda n, d=done: report(d + n, total), at)
        bounded = bounded_at(scores, sparsity)
    return RankedAtPlan(sparsity, scores, seen[-1], len(seen), bounded == seen[-1])

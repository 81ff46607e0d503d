"""The rule `duocal tune` chooses a sparsity by, on a measured curve (torch-free, testable alone).

A sparsity passes when, against full attention on the same data, its mean loss per scored token
(the expected answer's tokens, or a text's) rises by at most `tolerance` nats, and (where exact match
is measured) it loses at most `max_miss` of full attention's right answers: prompts full attention
answers right and it does not, counted prompt by prompt (answers it gets right where full attention
does not make up for none of them: a plan that trades one haystack's answers for another's is not
full attention's quality).
The chosen sparsity is the largest one that passes with every smaller measured sparsity passing too:
a curve that breaks and recovers by chance does not lift the choice past the break. When none
passes, the choice is 0 (every head full).

Two sets: the pick on the measuring set is checked on a confirming set (other prompts) at the pick and every
smaller sparsity, and the same rule applies there: a sparsity deploys only where it holds on both, so a hole
below the pick on prompts the pick never saw drops it (`choose_confirmed`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_TOLERANCE = 0.05  # nats per token: ~5% perplexity
DEFAULT_MAX_MISS = 0.125  # 1 prompt in 8


@dataclass(frozen=True)
class CurvePoint:
    """Quality and KV memory of one sparsity on the tuning data. `loss`: mean nats per scored token;
    `exact`: prompts whose greedy answer is the expected one (None: not measured, e.g. text); `lost`: of
    those full attention answers right, the prompts this sparsity does not (None where exact is not measured);
    `answered`: each prompt's greedy answer right or not (kept in memory for `lost`, not in the record);
    `right_answers`: each passkey prompt's free answer where it is right (decoded, or checked in one pass), else
    None (kept in memory: a later plan checks it in one pass before decoding its own, `tune_curve.answer_scores`)."""

    sparsity: float
    kv_bytes: int
    fraction_of_full: float
    loss: float
    exact: int | None
    total: int
    seconds: float = 0.0
    lost: int | None = None
    answered: tuple[bool, ...] | None = field(default=None, repr=False)
    right_answers: tuple[tuple[int, ...] | None, ...] | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """As JSON holds it: a loss that is not finite (the model's outputs overflowed) is null."""
        data = {**asdict(self), "loss": self.loss if math.isfinite(self.loss) else None}
        del data["answered"], data["right_answers"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CurvePoint:
        return cls(**{**data, "loss": math.nan if data.get("loss") is None else data["loss"]})


@dataclass(frozen=True)
class Rule:
    """When a sparsity's quality counts as full attention's (module docstring)."""

    tolerance: float = DEFAULT_TOLERANCE
    max_miss: float = DEFAULT_MAX_MISS

    def __post_init__(self):
        if not (math.isfinite(self.tolerance) and self.tolerance >= 0):
            raise ValueError(f"--tolerance must be a number of nats >= 0 (e.g. 0.05), got {self.tolerance}")
        if not 0.0 <= self.max_miss <= 1.0:
            raise ValueError(f"--max-miss must be a share of prompts in [0, 1] (e.g. 0.125), got {self.max_miss}")

    def allowed_losses(self, full_right: int) -> int:
        """Of full attention's `full_right` right answers, how many a sparsity may lose (1 in 8: 2 of 16)."""
        return math.floor(self.max_miss * full_right + 1e-9)

    def passes(self, point: CurvePoint, full: CurvePoint) -> bool:
        if not point.loss - full.loss <= self.tolerance:  # a NaN loss does not pass
            return False
        if point.exact is None or full.exact is None:
            return True
        if point.lost is None:
            raise ValueError(
                f"sparsity {point.sparsity:g} has exact match but no count of the answers it lost "
                "(a record from before duocal counted them): run duocal tune again"
            )
        return point.lost <= self.allowed_losses(full.exact)

    def describe(self) -> str:
        return (
            f"the largest sparsity whose loss per scored token stays within +{self.tolerance:g} nats of full "
            f"attention and that loses at most {self.max_miss:g} of full attention's right answers, prompt by "
            "prompt (where exact match is measured), every smaller measured sparsity passing too"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"tolerance_nats": self.tolerance, "max_miss": self.max_miss, "text": self.describe()}


def choose(points: list[CurvePoint], rule: Rule) -> float:
    """The sparsity `rule` picks on `points` (which hold full attention, sparsity 0)."""
    full = full_point(points)
    chosen = 0.0
    for point in sorted(points, key=lambda p: p.sparsity):
        if not rule.passes(point, full):
            break
        chosen = point.sparsity
    return chosen


def full_point(points: list[CurvePoint]) -> CurvePoint:
    found = [p for p in points if p.sparsity == 0.0]
    if not found:
        raise ValueError("the curve has no full-attention point (sparsity 0) to compare against")
    return found[0]


def to_confirm(sparsities: tuple[float, ...], pick: float) -> tuple[float, ...]:
    """The sparsities the confirming set measures: the pick and every smaller one (none when the pick is 0)."""
    return tuple(sorted(s for s in sparsities if 0 < s <= pick))


def choose_confirmed(measured: list[CurvePoint], confirmed: list[CurvePoint] | None, rule: Rule) -> float:
    """The largest sparsity that passes on both sets, every smaller one passing too: the measuring set's pick,
    dropped to where the confirming set (measured at the pick and below) still holds."""
    pick = choose(measured, rule)
    if pick == 0:
        return 0.0
    if confirmed is None:
        raise ValueError(f"the pick {pick:g} has not been confirmed on a second set of prompts")
    missing = sorted({*to_confirm(tuple(p.sparsity for p in measured), pick)} - {p.sparsity for p in confirmed})
    if missing:
        raise ValueError(f"the confirming set did not measure sparsity {missing[0]:g}, at or below the pick {pick:g}")
    return choose([p for p in confirmed if p.sparsity <= pick], rule)


def margin(points: list[CurvePoint], sparsity: float, rule: Rule) -> dict[str, Any] | None:
    """How far `sparsity`'s point stays inside the rule: nats below the tolerance and answers below the most it
    may lose (None: the set did not measure it)."""
    full = full_point(points)
    found = [p for p in points if p.sparsity == sparsity]
    if not found:
        return None
    point = found[0]
    answers = None
    if point.lost is not None and full.exact is not None:
        answers = rule.allowed_losses(full.exact) - point.lost
    loss = rule.tolerance - (point.loss - full.loss)
    return {"loss_nats": round(loss, 4) if math.isfinite(loss) else None, "answers": answers}

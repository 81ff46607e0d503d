"""The rule `duocal tune` chooses a sparsity by, on a measured curve (torch-free, testable alone).

A sparsity passes when, against full attention on the same data, its mean loss per scored token
(the expected answer's tokens, or a text's) rises by at most `tolerance` nats, and (where exact match
is measured) its greedy answers miss at most `max_miss` of the prompts more than full attention's.
The chosen sparsity is the largest one that passes with every smaller measured sparsity passing too:
a curve that breaks and recovers by chance does not lift the choice past the break. When none
passes, the choice is 0 (every head full).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_TOLERANCE = 0.05  # nats per token: ~5% perplexity
DEFAULT_MAX_MISS = 0.125  # 1 prompt in 8


@dataclass(frozen=True)
class CurvePoint:
    """Quality and KV memory of one sparsity on the tuning data. `loss`: mean nats per scored token;
    `exact`: prompts whose greedy answer is the expected one (None: not measured, e.g. text)."""

    sparsity: float
    kv_bytes: int
    fraction_of_full: float
    loss: float
    exact: int | None
    total: int
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """As JSON holds it: a loss that is not finite (the model's outputs overflowed) is null."""
        return {**asdict(self), "loss": self.loss if math.isfinite(self.loss) else None}

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

    def allowed_misses(self, total: int) -> int:
        """Answers a sparsity may miss beyond full attention's on `total` prompts (1 in 8: 2 of 16)."""
        return math.floor(self.max_miss * total + 1e-9)

    def passes(self, point: CurvePoint, full: CurvePoint) -> bool:
        if not point.loss - full.loss <= self.tolerance:  # a NaN loss does not pass
            return False
        if point.exact is None or full.exact is None:
            return True
        return full.exact - point.exact <= self.allowed_misses(point.total)

    def describe(self) -> str:
        return (
            f"the largest sparsity whose loss per scored token stays within +{self.tolerance:g} nats of full "
            f"attention and whose greedy answers miss at most {self.max_miss:g} of the prompts more than full "
            "attention's (where exact match is measured), every smaller measured sparsity passing too"
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

"""Mixed plans under a memory budget: each head gets the policy that loses least for the bytes.

Predicted loss of a head under a policy: 1 − the share of its attention mass the policy keeps
(the profile's `kept:<policy>` measurement), 0 for `full`. A profile without that measurement
(a calibrated one) uses its gate order instead: every bounded policy's loss is the head's score.

The choice is greedy, then locally optimal: every head starts on its cheapest policy; upgrades
are applied by loss saved per byte while they fit; then single-head changes are applied while
one fits the budget and lowers the total predicted loss. So no single head's policy change could
fit the budget with less predicted loss. Ties break by head index and policy order: the result
is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .errors import PlanError
from .policies import HeadPolicy
from .profile_measurements import kept_name


@dataclass(frozen=True)
class MixChoice:
    """What the planner chose: a policy index per flat head, and why."""

    choice: tuple[int, ...]  # index into `policies`, per flat head
    policies: tuple[HeadPolicy, ...]
    head_cost: tuple[int, ...]  # per policy, one head, in the budget's unit (bytes or tokens)
    losses: tuple[tuple[float, ...], ...]  # [flat head][policy]

    @property
    def cost(self) -> int:
        return sum(self.head_cost[c] for c in self.choice)

    @property
    def predicted_loss(self) -> float:
        return sum(self.losses[h][c] for h, c in enumerate(self.choice))

    def counts(self) -> dict[str, int]:
        """Policy name -> KV heads that got it (in the order of `policies`)."""
        return {p.name: sum(c == i for c in self.choice) for i, p in enumerate(self.policies)}

    def report(self) -> dict[str, Any]:
        return {
            "policy_counts": self.counts(),
            "cost": self.cost,
            "predicted_loss": round(self.predicted_loss, 6),
            "policies": [p.to_dict() for p in self.policies],
        }


def predicted_losses(profile, policies: Sequence[HeadPolicy]) -> tuple[tuple[float, ...], ...]:
    """[flat head][policy]: 0 for full; 1 − kept share when measured at these sizes; else the score."""
    scores = profile.flat_scores()
    columns = []
    for policy in policies:
        measured = profile.measurements.get(kept_name(policy.name))
        if not policy.bounded:
            columns.append([0.0] * len(scores))
        elif measured is not None and measured.settings.get("policy") == policy.to_dict():
            columns.append([1.0 - k for k in measured.flat()])
        else:
            columns.append(list(scores))
    return tuple(zip(*columns))


def choose_mix(losses, costs: Sequence[int], budget: float) -> list[int]:
    """Policy index per head with total cost <= budget (see module docstring)."""
    order = sorted(range(len(costs)), key=lambda p: costs[p])
    choice = [min(range(len(costs)), key=lambda p: (costs[p], losses[h][p], p)) for h in range(len(losses))]
    spent = sum(costs[c] for c in choice)
    if spent > budget:
        raise PlanError(f"impossible budget: even every head on its cheapest policy needs {spent}")
    while True:  # greedy: the upgrade that saves the most loss per byte and still fits
        best = None
        for h, row in enumerate(losses):
            for p in order:
                extra, saved = costs[p] - costs[choice[h]], row[choice[h]] - row[p]
                if saved > 0 and spent + extra <= budget:
                    rate = saved / extra if extra > 0 else float("inf")
                    if best is None or rate > best[0]:
                        best = (rate, h, p)
        if best is None:
            break
        _, h, p = best
        spent += costs[p] - costs[choice[h]]
        choice[h] = p
    return choice


def mixed_choice(profile, policies: Sequence[HeadPolicy], costs: Sequence[int], budget: float) -> MixChoice:
    """The mix of `policies` (one head of each costs `costs`) that fits `budget` (same unit)."""
    losses = predicted_losses(profile, policies)
    try:
        choice = choose_mix(losses, costs, budget)
    except PlanError as err:
        raise PlanError(
            f"{err} but the budget is {budget:g}; raise the budget, lower the context, or allow cheaper policies"
        ) from None
    return MixChoice(tuple(choice), tuple(policies), tuple(costs), losses)

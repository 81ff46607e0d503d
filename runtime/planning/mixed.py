"""Mixed plans under a memory budget: each head gets the policy that loses least for the bytes.

Predicted loss of a head under a policy: 1 − the share of its attention mass the policy keeps
(the profile's `kept:<policy>` measurement), 0 for `full`. A profile without that measurement
(a calibrated one) uses its gate order instead: every bounded policy's loss is the head's score.
Full heads in KIVI codes (`full-kv8`, `full-kv4`: bits are one more choice per head) lose the
relative error their codes add to the head's output (`error:full-kv<bits>`, measured by the
profiler at the same group and residual); a profile without it cannot mix widths, and says so.

The choice is greedy, then locally optimal: every head starts on its cheapest policy; upgrades
are applied by loss saved per byte while they fit; then single-head changes are applied while
one fits the budget and lowers the total predicted loss. So no single head's policy change could
fit the budget with less predicted loss. Ties break by head index and policy order: the result
is deterministic.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import PlanError
from ..policies import Full, HeadPolicy
from ..profile.measurements import error_name, kept_name

QUANTIZED_FULL = re.compile(r"full-kv(\d+)")  # full heads storing that many bits: full-kv8, full-kv4


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
        """Policy label (`full`, `full-kv4`, `sink_window`, ...) -> KV heads that got it (order of `policies`)."""
        return {p.label: sum(c == i for c in self.choice) for i, p in enumerate(self.policies)}

    def report(self) -> dict[str, Any]:
        return {
            "policy_counts": self.counts(),
            "cost": self.cost,
            "predicted_loss": round(self.predicted_loss, 6),
            "policies": [p.to_dict() for p in self.policies],
        }


def mix_policies(deploy, names: Sequence[str], full: Full, group: int, **sizes: int | None) -> list[HeadPolicy]:
    """The policies `names` stand for: `full` (the plan's width), `full-kv8` / `full-kv4` (codes in
    groups of `group`), others with the given sizes, else the profile's deploy sizes."""
    policies = []
    for name in names:
        quantized = QUANTIZED_FULL.fullmatch(name)
        if name == "full":
            policies.append(full)
        else:
            policies.append(Full.storing(int(quantized[1]), group) if quantized else deploy.sized(name, **sizes))
    return policies


def check_mix(policies: Sequence[HeadPolicy], unit: str) -> None:
    labels = [p.label for p in policies]
    if not policies or len(set(labels)) != len(labels):
        raise PlanError(f"policies must name distinct policies, got {labels}")
    widths = {p.label for p in policies if not p.bounded}
    if unit == "tokens" and len(widths) > 1:
        raise PlanError(
            f"a budget in tokens cannot tell {' from '.join(sorted(widths))} apart (they keep the same tokens): "
            "give the budget in bytes (e.g. '2GiB')"
        )


def quantization_losses(profile, policy: HeadPolicy) -> list[float]:
    measured = profile.measurements.get(error_name(policy.label))
    if measured is None or measured.settings.get("policy") != policy.to_dict():
        have = "no such measurement" if measured is None else f"one at {measured.settings.get('policy')}"
        raise PlanError(
            f"choosing {policy.label} per head needs the profile's measured {error_name(policy.label)} at "
            f"{policy.to_dict()} ({have}); measure it with `duocal profile MODEL --kv-bits {policy.kv_bits}` "
            "(add --scores-from to keep a profile's scores), or give every full head one width with kv_bits="
        )
    return list(measured.flat())


def predicted_losses(profile, policies: Sequence[HeadPolicy]) -> tuple[tuple[float, ...], ...]:
    """[flat head][policy]: 0 for full (16-bit, or the one width given), the measured output error for
    quantized full heads beside other widths; 1 − kept share when measured at these sizes; else the score."""
    scores = profile.flat_scores()
    widths = len({p.label for p in policies if not p.bounded})  # one: the plan's kv_bits, not a choice
    columns = []
    for policy in policies:
        measured = profile.measurements.get(kept_name(policy.name))
        if not policy.bounded:
            quantized = policy.quantized and widths > 1
            columns.append(quantization_losses(profile, policy) if quantized else [0.0] * len(scores))
        elif measured is not None and measured.settings.get("policy") == policy.to_dict():
            columns.append([1.0 - k for k in measured.flat()])
        else:
            columns.append(list(scores))
    return tuple(zip(*columns, strict=True))


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

"""The plans behind each evaluation row, shared by every evaluation (passkey, perplexity).

| row         | plan                                                     | sparsity  |
|-------------|----------------------------------------------------------|-----------|
| `full`      | every head full (the reference)                          | 0         |
| `duo`       | the profile at that sparsity: its lowest-scoring heads on sink + recent (DuoAttention, arXiv 2410.10819) | each |
| `streaming` | every head on sink + recent (StreamingLLM, arXiv 2309.17453) | 1     |
| `h2o`       | every head on H2O (arXiv 2306.14048), with the KV bytes of `duo` at that sparsity | each |
| `random`    | that many heads chosen at random on sink + recent; several seeds, mean / min / max | each |
| `mix`       | a policy per head among `mix_policies` (default full, sink_window, h2o) chosen by the profile's measurements under the KV budget of `duo` at that sparsity (duocal_runtime/mixing.py) | each |

`h2o` and `random` do not need a profile: any plan with the same number of sink + recent heads
has the same KV bytes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import duocal_runtime as dr

ROW_KINDS = ("full", "duo", "streaming", "h2o", "random", "mix")
NEED_SPARSITY = ("duo", "h2o", "random", "mix")
NEED_PROFILE = ("duo", "mix")
DEFAULT_ROWS = ("full", "duo", "streaming", "h2o", "random")  # mix on request
MIX_POLICIES = ("full", "sink_window", "h2o")
DEFAULT_WINDOW = dr.SinkWindow()
Progress = Callable[[int, int, str], None]  # (units done, units in all, what is running)


def check_rows(policies: Sequence[str], sparsities: Sequence[float]) -> None:
    """Raise `ValueError` for unknown or repeated row kinds and sparsities outside [0, 1]."""
    unknown = [p for p in policies if p not in ROW_KINDS]
    if unknown or not policies:
        raise ValueError(f"unknown policy {', '.join(map(repr, unknown)) or '(none given)'}; "
                         f"choose from {', '.join(ROW_KINDS)}")
    if len(set(policies)) != len(policies):
        raise ValueError(f"policy given twice: {', '.join(policies)}")
    bad = [s for s in sparsities if not 0.0 <= s <= 1.0]
    if bad or (not sparsities and any(p in policies for p in NEED_SPARSITY)):
        raise ValueError(f"sparsity must be in [0, 1] (fraction of KV heads made non-retrieval), got "
                         f"{', '.join(map(str, bad)) or 'none'}")


def streaming_window(profile: dr.Profile | None, sink: int | None, recent: int | None) -> dr.SinkWindow:
    """The sink + recent policy of streaming heads: given sizes, else the profile's, else 64 / 256."""
    d = profile.deploy if profile is not None else DEFAULT_WINDOW
    return dr.SinkWindow(sink=sink or d.sink, recent=recent or d.recent)


@dataclass(frozen=True)
class Variant:
    """The plans behind one row: one plan, or one per seed (random)."""

    policy: str
    sparsity: float
    plans: tuple[dr.Plan, ...]
    seeds: tuple[int, ...] | None = None


def streaming_count(shape: dr.ModelShape, sparsity: float) -> int:
    """KV heads made non-retrieval at `sparsity` (the runtime's rule: round(sparsity * heads))."""
    return round(sparsity * shape.num_kv_heads_total)


def matched_tokens(shape: dr.ModelShape, sparsity: float, window: dr.SinkWindow, context: int) -> int:
    """Cached (token, KV head) pairs of any plan with `sparsity` of its heads on `window`, the rest full."""
    heads = set(range(streaming_count(shape, sparsity)))
    return dr.plan_from_streaming_set(shape, heads, window).kv_tokens(context)


def duo_plan(profile: dr.Profile, sparsity: float, window: dr.SinkWindow) -> dr.Plan:
    return dr.plan(profile, sparsity=sparsity, policy="sink_window", sink=window.sink, recent=window.recent)


def h2o_plan(shape: dr.ModelShape, tokens: int, context: int) -> dr.Plan:
    """H2O on every head, each keeping `tokens // heads` (half heavy hitters, half recent, as in
    the H2O paper), so the plan holds at most `tokens` (token, head) pairs at `context`."""
    budget = max(2, min(context, tokens // shape.num_kv_heads_total))
    recent = budget // 2
    return dr.uniform_plan(shape, dr.H2O(heavy=budget - recent, recent=recent))


def mix_plan(profile: dr.Profile, tokens: int, context: int, policies=MIX_POLICIES) -> dr.Plan:
    """The budget planner's choice among `policies` with at most `tokens` (token, head) pairs at `context`."""
    return dr.plan(profile, budget=int(tokens), context=context, policies=tuple(policies))


def random_plans(shape: dr.ModelShape, sparsity: float, window: dr.SinkWindow,
                 seeds: Sequence[int]) -> tuple[dr.Plan, ...]:
    """For each seed, `streaming_count` heads drawn uniformly on `window`, the rest full."""
    count, heads = streaming_count(shape, sparsity), range(shape.num_kv_heads_total)
    return tuple(
        dr.plan_from_streaming_set(shape, set(random.Random(f"duocal-eval-random:{seed}").sample(heads, count)), window)
        for seed in seeds
    )


def build_variants(shape: dr.ModelShape, config: Any, context: int, window: dr.SinkWindow,
                   profile: dr.Profile | None = None, plans: Mapping[str, dr.Plan] | None = None) -> list[Variant]:
    """Every row's plans at one context, in the order of `config.policies` (row kinds), then
    `plans`. `config` gives `policies`, `sparsities` and `random_seeds`."""
    out: list[Variant] = []
    for policy in config.policies:
        if policy == "full":
            out.append(Variant("full", 0.0, (dr.uniform_plan(shape, dr.Full()),)))
        elif policy == "streaming":
            out.append(Variant("streaming", 1.0, (dr.uniform_plan(shape, window),)))
        else:
            for s in config.sparsities:
                if policy == "duo":
                    out.append(Variant("duo", s, (duo_plan(profile, s, window),)))
                elif policy == "h2o":
                    out.append(Variant("h2o", s, (h2o_plan(shape, matched_tokens(shape, s, window, context), context),)))
                elif policy == "mix":
                    out.append(Variant("mix", s, (mix_plan(profile, matched_tokens(shape, s, window, context), context,
                                                           getattr(config, "mix_policies", MIX_POLICIES)),)))
                else:
                    seeds = tuple(range(config.random_seeds))
                    out.append(Variant("random", s, random_plans(shape, s, window, seeds), seeds))
    for name, plan in (plans or {}).items():
        if plan.shape != shape:
            raise ValueError(f"plan {name!r} is for {plan.shape.describe()}, the model has {shape.describe()}")
        out.append(Variant(name, plan.sparsity, (plan,)))
    return out


def head_policy(plan: dr.Plan) -> dict[str, Any] | None:
    """The first non-full policy of `plan` with its sizes (None for an all-full plan)."""
    return next((p.to_dict() for row in plan.policies for p in row if p.bounded), None)



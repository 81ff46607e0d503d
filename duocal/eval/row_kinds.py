"""Evaluation rows: one registry entry per row kind, shared by every evaluation (passkey, perplexity).

| row         | plan                                                                          | sparsity |
|-------------|-------------------------------------------------------------------------------|----------|
| `full`      | every head full (the reference)                                               | 0        |
| `duo`       | the profile's lowest-scoring heads on sink + recent (DuoAttention, 2410.10819) | each     |
| `streaming` | every head on sink + recent, positions within the cache (StreamingLLM, arXiv 2309.17453) | 1 |
| `h2o`       | every head on H2O (arXiv 2306.14048), with the KV bytes of `duo`               | each     |
| `random`    | that many heads drawn at random on sink + recent; seeds: mean / min / max      | each     |
| `mix`       | a policy per head among `mix_policies` chosen by measurement at `duo`'s bytes  | each     |
| `snapkv`    | every head on SnapKV (arXiv 2404.14469, query-aware), with the KV bytes of `duo` | each     |

`mix` chooses among full, sink_window and h2o by default (duocal_runtime/planning/mixed.py).

A new row is one `register_row(RowKind(...))`: what it needs, how its plans are made, how it is
drawn. `h2o` and `random` need no profile: any plan with the same number of bounded heads has the
same KV bytes. Head counts follow the runtime's rule (`duocal_runtime.planning.head_order.bounded_head_count`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import duocal_runtime as dr
from duocal.eval import ROW_NAMES
from duocal.measure.limits import refuse_beyond_positions as beyond_positions
from duocal_runtime.planning.head_order import bounded_head_count
from duocal_runtime.policies import POLICIES

MIX_POLICIES = ("full", "sink_window", "h2o")
KV_BITS = (16, 8, 4)  # widths full heads store (duocal_runtime.quant.codes.BITS)
DEFAULT_SINK_WINDOW = dr.SinkWindow()


@dataclass(frozen=True)
class RowInputs:
    """What every row kind builds its plans from, at one context length."""

    shape: dr.ModelShape
    context: int
    sink_window: dr.SinkWindow  # the sink window of bounded heads
    profile: dr.Profile | None = None
    random_seeds: int = 3
    mix_policies: tuple[str, ...] = MIX_POLICIES


@dataclass(frozen=True)
class RowKind:
    """One kind of evaluation row. `plans(inputs, sparsity)` gives its plans (several: one per seed)
    and the seeds (None for a single plan); `sparsity` is None for kinds with a fixed sparsity."""

    name: str
    plans: Callable[[RowInputs, float | None], tuple[tuple[dr.Plan, ...], tuple[int, ...] | None]]
    needs_profile: bool = False
    per_sparsity: bool = True  # one row per requested sparsity (else one row, at `fixed_sparsity`)
    fixed_sparsity: float = 0.0
    default: bool = True  # evaluated when no rows are named
    style: tuple[str, str] = ("tab:gray", "D")  # matplotlib colour and marker
    streams: bool = False  # no head sees a distance past what it keeps: it runs past the trained length


ROWS: dict[str, RowKind] = {}


def register_row(kind: RowKind) -> RowKind:
    ROWS[kind.name] = kind
    return kind


@dataclass(frozen=True)
class RowPlans:
    """The plans behind one row: one plan, or one per seed (random)."""

    row: str
    sparsity: float
    plans: tuple[dr.Plan, ...]
    seeds: tuple[int, ...] | None = None
    kv_bits: int = 16  # how the plans' full heads store keys and values

    @property
    def label(self) -> str:
        kind = ROWS.get(self.row)
        bits = f", {self.kv_bits}-bit KV" if self.kv_bits != 16 else ""
        return self.row + (f" @ sparsity {self.sparsity:g}" if kind is None or kind.per_sparsity else "") + bits


def bits_variants(row: RowPlans, kv_bits: Sequence[int]) -> list[RowPlans]:
    """The row at each of `kv_bits`; a row without full heads is the same at every width: once, at 16."""
    has_full = any(not p.bounded for plan in row.plans for r in plan.policies for p in r)
    wanted = [b for b in kv_bits if b == 16 or has_full] or [16]
    return [
        row if b == 16 else replace(row, plans=tuple(dr.with_kv_bits(p, b) for p in row.plans), kv_bits=b)
        for b in wanted
    ]


# --- the plans of each kind -----------------------------------------------------------------
def matched_tokens(shape: dr.ModelShape, sparsity: float, sink_window: dr.SinkWindow, context: int) -> int:
    """Cached (token, KV head) pairs of any plan with `sparsity` of its heads on `sink_window`, the rest full."""
    heads = set(range(bounded_head_count(shape.num_kv_heads_total, sparsity)))
    return dr.plan_from_bounded_set(shape, heads, sink_window).kv_tokens(context)


def duo_plan(profile: dr.Profile, sparsity: float, sink_window: dr.SinkWindow) -> dr.Plan:
    return dr.plan(
        profile,
        sparsity=sparsity,
        policy="sink_window",
        sink=sink_window.sink,
        recent=sink_window.recent,
        positions=sink_window.positions,
    )


def h2o_plan(shape: dr.ModelShape, tokens: int, context: int) -> dr.Plan:
    """H2O on every head, each keeping `tokens // heads` (half heavy hitters, half recent, as in
    the H2O paper), so the plan holds at most `tokens` (token, head) pairs at `context`."""
    capacity = max(2, min(context, tokens // shape.num_kv_heads_total))
    return dr.uniform_plan(shape, dr.H2O.halves(capacity))


def snapkv_plan(shape: dr.ModelShape, tokens: int, context: int) -> dr.Plan:
    """SnapKV on every head, each keeping `tokens // heads` (an observation window of 32, or a quarter below 128)."""
    capacity = max(2, min(context, tokens // shape.num_kv_heads_total))
    return dr.uniform_plan(shape, dr.SnapKV.keeping(capacity))


def mix_plan(profile: dr.Profile, tokens: int, context: int, policies: Sequence[str] = MIX_POLICIES) -> dr.Plan:
    """The budget planner's choice among `policies` with at most `tokens` (token, head) pairs at `context`."""
    return dr.plan(profile, budget=int(tokens), context=context, policies=tuple(policies))


def random_plans(
    shape: dr.ModelShape, sparsity: float, sink_window: dr.SinkWindow, seeds: Sequence[int]
) -> tuple[dr.Plan, ...]:
    """For each seed, the runtime's head count at `sparsity` drawn uniformly on `sink_window`, the rest full."""
    count, heads = bounded_head_count(shape.num_kv_heads_total, sparsity), range(shape.num_kv_heads_total)
    return tuple(
        dr.plan_from_bounded_set(
            shape, set(random.Random(f"duocal-eval-random:{seed}").sample(heads, count)), sink_window
        )
        for seed in seeds
    )


def _one(plan: dr.Plan):
    return (plan,), None


def _random(inputs: RowInputs, sparsity):
    seeds = tuple(range(inputs.random_seeds))
    return random_plans(inputs.shape, sparsity, inputs.sink_window, seeds), seeds


def _capacity(inputs: RowInputs, sparsity) -> int:
    return matched_tokens(inputs.shape, sparsity, inputs.sink_window, inputs.context)


register_row(
    RowKind("full", lambda i, s: _one(dr.uniform_plan(i.shape, dr.Full())), per_sparsity=False, style=("black", "*"))
)
register_row(
    RowKind(
        "duo", lambda i, s: _one(duo_plan(i.profile, s, i.sink_window)), needs_profile=True, style=("tab:blue", "o")
    )
)
register_row(
    RowKind(
        "streaming",
        lambda i, s: _one(dr.uniform_plan(i.shape, replace(i.sink_window, positions="cache"))),
        per_sparsity=False,
        fixed_sparsity=1.0,
        style=("tab:orange", "s"),
        streams=True,
    )
)
register_row(RowKind("h2o", lambda i, s: _one(h2o_plan(i.shape, _capacity(i, s), i.context)), style=("tab:green", "^")))
register_row(RowKind("random", _random, style=("tab:red", "v")))
register_row(
    RowKind(
        "snapkv",
        lambda i, s: _one(snapkv_plan(i.shape, _capacity(i, s), i.context)),
        default=False,
        style=("tab:brown", "X"),
    )
)
register_row(
    RowKind(
        "mix",
        lambda i, s: _one(mix_plan(i.profile, _capacity(i, s), i.context, i.mix_policies)),
        needs_profile=True,
        default=False,
        style=("tab:purple", "P"),
    )
)

assert tuple(ROWS) == ROW_NAMES, "duocal.eval.ROW_NAMES names the registered rows, in their order"


# --- choosing and building rows -------------------------------------------------------------
def default_rows(has_profile: bool) -> tuple[str, ...]:
    """The rows evaluated when none are named: every default kind the profile (or its absence) allows."""
    return tuple(name for name, kind in ROWS.items() if kind.default and (has_profile or not kind.needs_profile))


def check_kv_bits(kv_bits: Sequence[int]) -> None:
    """Raise `ValueError` unless `kv_bits` are distinct widths of 16, 8 and 4."""
    if not kv_bits or len(set(kv_bits)) != len(kv_bits) or not set(kv_bits) <= set(KV_BITS):
        raise ValueError(
            f"kv bits must be distinct values of 16, 8 and 4, got {', '.join(map(str, kv_bits)) or 'none'}"
        )


def check_mix_policies(policies: Sequence[str]) -> None:
    """Raise `ValueError` unless `policies` are distinct known policy names, `full` and a bounded one among them."""
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or len(set(policies)) != len(policies) or "full" not in policies or len(policies) < 2:
        raise ValueError(
            f"mix policies must be distinct names from {', '.join(POLICIES)}, full and at least one other among them; "
            f"got {', '.join(policies) or 'none'}"
        )


def check_rows(rows: Sequence[str], sparsities: Sequence[float]) -> None:
    """Raise `ValueError` for unknown or repeated row kinds and sparsities outside [0, 1]."""
    unknown = [r for r in rows if r not in ROWS]
    if unknown or not rows:
        raise ValueError(
            f"unknown row {', '.join(map(repr, unknown)) or '(none given)'}; choose from {', '.join(ROWS)}"
        )
    if len(set(rows)) != len(rows):
        raise ValueError(f"row given twice: {', '.join(rows)}")
    bad = [s for s in sparsities if not 0.0 <= s <= 1.0]
    if bad or (not sparsities and any(ROWS[r].per_sparsity for r in rows)):
        raise ValueError(
            f"sparsity must be in [0, 1] (fraction of KV heads made bounded), got {', '.join(map(str, bad)) or 'none'}"
        )


def require_profile(rows: Sequence[str], profile: dr.Profile | None, model_config: Any = None) -> None:
    """Raise `ValueError` when a row needs a profile and none is given, or the profile is for another model."""
    needs = [r for r in rows if ROWS[r].needs_profile]
    if needs and profile is None:
        raise ValueError(
            f"row '{needs[0]}' needs a profile of this model: pass --profile (a file or prebuilt name, "
            f"see duocal profiles list), or leave {' and '.join(needs)} out of --rows"
        )
    if profile is not None and model_config is not None:
        profile.check_compatible(model_config)


def refuse_rows_beyond_positions(
    contexts, model_config: Any, advice: str, generated: int = 0, rows: Sequence[str] | None = None
) -> None:
    """`measure.limits.refuse_beyond_positions`, unless every one of `rows` streams (no head sees a distance past
    what it keeps); the refusal names the rows whose heads see original positions."""
    if rows and set(rows) <= set(ROWS) and all(ROWS[r].streams for r in rows):
        return
    held = [r for r in rows or () if r not in ROWS or not ROWS[r].streams]
    which = f": rows {', '.join(held)} have heads that see original positions" if held else ""
    streaming = ", or evaluate only --rows streaming (positions within the cache: no limit)" if rows else ""
    beyond_positions(contexts, model_config, f"{advice}{streaming}", generated, which)


def row_sink_window(
    profile: dr.Profile | None, sink: int | None, recent: int | None, positions: str | None = None
) -> dr.SinkWindow:
    """The sink window of bounded heads: given sizes and positions, else the profile's, else 64 / 256, original."""
    d = profile.deploy.sink_window if profile is not None else DEFAULT_SINK_WINDOW
    return dr.SinkWindow(sink=sink or d.sink, recent=recent or d.recent, positions=positions or d.positions)


def build_rows(
    rows: Sequence[str],
    sparsities: Sequence[float],
    inputs: RowInputs,
    plans: Mapping[str, dr.Plan] | None = None,
    kv_bits: Sequence[int] = (16,),
) -> list[RowPlans]:
    """Every row's plans at one context, in the order of `rows` (each per sparsity where it has
    one, and per KV width where it has full heads), then the hand-made `plans` by name."""
    out: list[RowPlans] = []
    for name in rows:
        kind = ROWS[name]
        for s in sparsities if kind.per_sparsity else (None,):
            built, seeds = kind.plans(inputs, s)
            out += bits_variants(RowPlans(name, kind.fixed_sparsity if s is None else s, built, seeds), kv_bits)
    for name, plan in (plans or {}).items():
        if plan.shape != inputs.shape:
            raise ValueError(f"plan {name!r} is for {plan.shape.describe()}, the model has {inputs.shape.describe()}")
        out.append(RowPlans(name, plan.sparsity, (plan,)))
    return out


def head_policy(plan: dr.Plan) -> dict[str, Any] | None:
    """The first bounded policy of `plan` with its sizes (None for an all-full plan)."""
    return next((p.to_dict() for row in plan.policies for p in row if p.bounded), None)

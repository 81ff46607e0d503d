"""Plans: a policy for every (layer, KV head), made from a profile's scores.

`plan(profile, sparsity=0.5)` follows upstream DuoAttention's rule (``sparsify_attention_heads``
in duo_attn/utils.py: a global quantile over all heads; heads at or above it stay full) but is
exact and deterministic: exactly ``round(sparsity * heads)`` heads become bounded, taken
in *bounded order* (the order heads stop being full; planning/head_order.py):

    ascending score; among equal scores (exact ties only), the head that loses least when
    bounded first when the profile measured it, else the head with the larger flat index
    (layer * num_kv_heads + head) first.

So ties never depend on random noise (upstream adds U(0, 1e-6) noise; on its
Mistral-7B-Instruct-v0.2 pattern 20 heads tie at the 50% threshold), and no head is bounded while
a head with a smaller score stays full. Without ties and where upstream's quantile count
(``ceil(q * (n - 1))``) equals ``round(q * n)`` — e.g. q in {0.25, 0.5, 0.75} for 256 or 1024
heads — the result is identical to upstream's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..checks import require_count, require_instance
from ..errors import PlanError
from ..policies import Full, HeadPolicy, policy_from_dict
from ..profile.format import Profile
from ..profile.shape import ModelShape
from ..quant.codes import default_group
from . import summary as plan_summary
from .budget import Budget, budget_dtype_of, dtype_bytes, max_context
from .head_order import (
    bounded_heads_for_sparsity,
    bounded_heads_for_threshold,
    bounded_order,
    check_head_choice,
    tie_losses,
)
from .mixed import check_mix, mix_policies, mixed_choice


@dataclass(frozen=True)
class Plan:
    """A policy for each (layer, KV head). `policies[layer][kv_head]`."""

    shape: ModelShape
    policies: tuple[tuple[HeadPolicy, ...], ...]
    model_name: str | None = None
    choice: dict[str, Any] | None = field(default=None, compare=False)  # what a budget planner chose, and why
    budget_dtype: str | None = field(default=None, compare=False)  # the dtype a budget in bytes was planned in

    def __post_init__(self):
        table = tuple(tuple(row) for row in self.policies)
        want = (self.shape.num_hidden_layers, self.shape.num_key_value_heads)
        got = (len(table), len(table[0]) if table else 0)
        if got != want or any(len(row) != want[1] for row in table):
            raise PlanError(f"plan table is {got[0]}x{got[1]}, model has {want[0]} layers x {want[1]} KV heads")
        object.__setattr__(self, "policies", table)
        for policy in {p for row in table for p in row}:
            policy.check_head_dim(self.shape.head_dim)

    # --- what it does -------------------------------------------------------------------
    @property
    def num_heads(self) -> int:
        return self.shape.num_kv_heads_total

    @property
    def num_bounded(self) -> int:
        return sum(p.bounded for row in self.policies for p in row)

    @property
    def sparsity(self) -> float:
        """Fraction of KV heads that are not `full` (achieved, not requested)."""
        return self.num_bounded / self.num_heads

    @property
    def retrieval_heads_per_layer(self) -> list[int]:
        return [sum(not p.bounded for p in row) for row in self.policies]

    @property
    def full_attention_prefix(self) -> int:
        """First tokens of a sequence every head attends to and keeps as full attention does (the least of
        its policies' `full_attention_prefix`): a cache can take them from full attention's (`DuoCache.load_prefix`)."""
        return min(p.full_attention_prefix for row in self.policies for p in row)

    @property
    def chunking_changes_result(self) -> bool:
        """Whether cutting a pass into chunks (or feeding tokens one at a time) can change what a head keeps: any
        policy that evicts after each pass (H2O, SnapKV)."""
        return any(p.chunking_changes_result for row in self.policies for p in row)

    @property
    def cache_positions(self) -> bool:
        """Whether any head sees positions within its cache (StreamingLLM's rule, `SinkWindow(positions="cache")`)."""
        return any(p.cache_positions for row in self.policies for p in row)

    @property
    def distances_bounded(self) -> bool:
        """Whether no head ever sees a distance beyond what it keeps (every head sees positions within its
        cache): the plan streams past the model's trained length, at constant memory."""
        return all(p.cache_positions for row in self.policies for p in row)

    def layer_groups(self, layer: int) -> list[tuple[HeadPolicy, list[int]]]:
        """The layer's KV heads grouped by identical policy, in order of first appearance."""
        groups: dict[HeadPolicy, list[int]] = {}
        for head, policy in enumerate(self.policies[layer]):
            groups.setdefault(policy, []).append(head)
        return list(groups.items())

    # --- memory -------------------------------------------------------------------------
    def kv_tokens(self, context: int, batch: int = 1) -> int:
        """Cached (token, KV head) pairs at `context` tokens, summed over layers and heads."""
        require_count("context", context, 0)
        require_count("batch", batch, 1)
        return batch * sum(p.tokens_kept(context) for row in self.policies for p in row)

    def kv_bytes(self, context: int, batch: int = 1, dtype: Any = "bfloat16") -> int:
        """Bytes of keys and values at `context` tokens (both K and V, every layer)."""
        require_count("context", context, 0)
        require_count("batch", batch, 1)
        per_element, d = dtype_bytes(dtype), self.shape.head_dim
        return batch * sum(p.kv_bytes(context, d, per_element) for row in self.policies for p in row)

    def max_context(self, memory: Any, batch: int = 1, dtype: Any = "bfloat16") -> int:
        """The most tokens per sequence whose KV cache fits `memory` ('80GB', bytes) for `batch` sequences."""
        return max_context(self, memory, batch, dtype)

    def memory_report(self, context: int, batch: int = 1, dtype: Any = "bfloat16") -> dict[str, Any]:
        full = uniform_plan(self.shape, Full())
        plan_bytes, full_bytes = self.kv_bytes(context, batch, dtype), full.kv_bytes(context, batch, dtype)
        return {
            "context": context,
            "batch": batch,
            "dtype": str(dtype).removeprefix("torch."),
            "kv_tokens_full": full.kv_tokens(context, batch),
            "kv_tokens_plan": self.kv_tokens(context, batch),
            "kv_bytes_full": full_bytes,
            "kv_bytes_plan": plan_bytes,
            "fraction_of_full": plan_bytes / full_bytes if full_bytes else 1.0,
        }

    # --- for people (planning/summary.py) ---------------------------------------------------
    def policy_counts(self) -> dict[str, int]:
        """'sink_window(sink=64, recent=512)' -> KV heads with it, in order of first appearance."""
        return plan_summary.policy_counts(self)

    def summary(self, context: int = 4096, dtype: Any = None) -> str:
        """A few lines: the model, the heads per policy, full heads per layer, KV memory at `context`."""
        return plan_summary.summary(self, context, dtype)

    def __repr__(self) -> str:
        return plan_summary.one_line(self)

    # --- serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "model": {"name_or_path": self.model_name, **self.shape.to_dict()},
            "policies": [[p.to_dict() for p in row] for row in self.policies],
            **({"budget_dtype": self.budget_dtype} if self.budget_dtype else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        model = dict(data["model"])
        name = model.pop("name_or_path", None)
        table = [[policy_from_dict(p) for p in row] for row in data["policies"]]
        return cls(ModelShape(**model), table, name, budget_dtype=data.get("budget_dtype"))


def uniform_plan(shape: ModelShape, policy: HeadPolicy, model_name: str | None = None) -> Plan:
    """Every head gets the same policy (full attention, StreamingLLM-all, H2O-all)."""
    row = (policy,) * shape.num_key_value_heads
    return Plan(shape, (row,) * shape.num_hidden_layers, model_name)


def plan_from_bounded_set(
    shape: ModelShape, bounded: set[int], policy: HeadPolicy, model_name: str | None = None, full: Full = Full()
) -> Plan:
    """Heads in `bounded` (flat indices) get `policy`, the others `full` (default: 16-bit)."""
    k = shape.num_key_value_heads
    table = [
        [policy if layer * k + head in bounded else full for head in range(k)]
        for layer in range(shape.num_hidden_layers)
    ]
    return Plan(shape, table, model_name)


def _bounded_for_budget(profile: Profile, policy: HeadPolicy, budget: Budget, context, batch, dtype, full) -> set[int]:
    if context is None or context <= 0:
        raise PlanError("a budget needs the context length it applies to: pass context=N (tokens)")
    order = bounded_order(profile.flat_scores(), tie_losses(profile, policy))
    shape, name = profile.shape, profile.model.name_or_path

    def cost(k: int) -> int:
        return budget.measure(plan_from_bounded_set(shape, set(order[:k]), policy, name, full), context, batch, dtype)

    if cost(len(order)) > budget.amount:
        raise PlanError(
            f"impossible budget: {budget.describe()} at context {context}, but even with every head "
            f"on {policy} the KV cache needs {budget.describe(cost(len(order)))}; raise the budget or shrink "
            "the policy's sizes"
        )
    lo, hi = 0, len(order)  # cost is non-increasing in k: find the smallest k that fits
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if cost(mid) <= budget.amount else (mid + 1, hi)
    return set(order[:lo])


def plan(
    profile: Profile,
    *,
    sparsity: float | None = None,
    threshold: float | None = None,
    budget: str | int | Budget | None = None,
    context: int | None = None,
    policy: str | None = None,
    policies: Sequence[str] | None = None,
    sink: int | None = None,
    recent: int | None = None,
    heavy: int | None = None,
    positions: str | None = None,
    batch: int = 1,
    dtype: Any = "bfloat16",
    kv_bits: int = 16,
    kv_group: int | None = None,
) -> Plan:
    """Turn a profile into a per-head plan.

    Give at most one of `sparsity` (fraction of KV heads that become bounded), `threshold`
    (heads scoring below it become bounded) or `budget` (bytes or tokens of KV cache at
    `context` tokens, `batch` and `dtype`: the fewest bounded heads that fit). With none,
    the profile's deploy sparsity is used. Bounded heads get `policy` (default: the
    profile's) with the given sizes (defaults: the profile's deploy sizes).

    With `policies` (e.g. ("full", "sink_window", "h2o")) and a `budget`, every head gets the one
    of those policies that loses least for its bytes (planning/mixed.py): measured kept attention
    where the profile has it, else the gate order; `full-kv8` / `full-kv4` among them choose a width per
    head by measured output error (a byte budget). `plan.choice` says what was chosen.

    `kv_bits` (16, 8 or 4): how full heads store keys and values, KIVI codes below 16 with a scale
    and zero point per `kv_group` tokens (keys) or channels (values; default gcd(32, head_dim));
    budgets count their bytes (codes, scales, zero points, the 128-token full-precision residual).

    `positions` ("original" or "cache"; default: the profile's) is what every sink-window head sees:
    each key at its place in the sequence (DuoAttention), or within the cache (StreamingLLM: no
    distance beyond sink + recent; a plan of such heads only streams past the trained length)."""
    require_instance("profile", profile, Profile, "a Profile (load one with dr.load_profile(path_or_name))")
    check_head_choice(sparsity=sparsity, threshold=threshold, budget=budget)
    if context is not None:
        require_count("context", context, 1)
    require_count("batch", batch, 1)
    d, group = profile.deploy, kv_group or default_group(profile.shape.head_dim)
    full = Full.storing(kv_bits, group)
    if isinstance(policies, str):
        raise TypeError(f"policies must be a list of policy names, e.g. ('full', 'h2o'), got the string {policies!r}")
    if policies is not None:
        if budget is None or policy is not None:
            raise PlanError(
                "policies=... chooses a policy per head under a budget: pass budget= and context=, and not policy="
            )
        sized = mix_policies(d, policies, full, group, sink=sink, recent=recent, heavy=heavy, positions=positions)
        check_positions_taken(sized, positions)
        return _mixed_plan(profile, sized, Budget.parse(budget), context, batch, dtype)
    bounded_policy = d.sized(policy or d.policy, sink=sink, recent=recent, heavy=heavy, positions=positions)
    check_positions_taken([bounded_policy], positions)
    if not bounded_policy.bounded:
        raise PlanError("the policy for bounded heads cannot be 'full'; use sparsity=0 for an all-full plan")
    flat = profile.flat_scores()
    if threshold is not None:
        bounded = bounded_heads_for_threshold(flat, threshold)
    elif budget is not None:
        bounded = _bounded_for_budget(profile, bounded_policy, Budget.parse(budget), context, batch, dtype, full)
    else:
        chosen = d.sparsity if sparsity is None else sparsity
        bounded = bounded_heads_for_sparsity(flat, chosen, tie_losses(profile, bounded_policy))
    made = plan_from_bounded_set(profile.shape, bounded, bounded_policy, profile.model.name_or_path, full)
    return replace(made, budget_dtype=budget_dtype_of(budget, dtype))


def check_positions_taken(policies: Sequence[HeadPolicy], positions: str | None) -> None:
    """positions='cache' is a sink-window rule: refused where no bounded policy of the plan takes it."""
    if positions == "cache" and not any(p.cache_positions for p in policies):
        names = ", ".join(p.name for p in policies if p.bounded)
        raise PlanError(
            f"positions='cache' is for sink_window heads; {names} heads keep their original positions (heavy "
            "hitters can come from anywhere in the sequence, so no window bounds the distances they see)"
        )


def _mixed_plan(profile: Profile, policies: list[HeadPolicy], budget: Budget, context, batch, dtype) -> Plan:
    if context is None:
        raise PlanError("a budget needs the context length it applies to: pass context=N (tokens)")
    check_mix(policies, budget.unit)
    d, size = profile.shape.head_dim, dtype_bytes(dtype)
    costs = [  # one KV head, in the budget's unit
        batch * (p.kv_bytes(context, d, size) if budget.unit == "bytes" else p.tokens_kept(context)) for p in policies
    ]
    mix = mixed_choice(profile, policies, costs, budget.amount)
    k = profile.shape.num_key_value_heads
    table = [
        [mix.policies[mix.choice[layer * k + head]] for head in range(k)]
        for layer in range(profile.shape.num_hidden_layers)
    ]
    report = {**mix.report(), "unit": budget.unit, "budget": budget.amount, "context": context, "batch": batch}
    return Plan(
        profile.shape, table, profile.model.name_or_path, choice=report, budget_dtype=budget_dtype_of(budget, dtype)
    )


def with_kv_bits(plan: Plan, kv_bits: int, group: int | None = None) -> Plan:
    """`plan` with its 16-bit full heads storing `kv_bits` (16, 8, 4), in groups of `group` tokens
    (keys) and channels (values); default gcd(32, head_dim). Bounded heads are unchanged."""
    full = Full.storing(kv_bits, group or default_group(plan.shape.head_dim))
    return replace(plan, policies=[[full if p == Full() else p for p in row] for row in plan.policies])

"""Plans for tensor parallelism: every rank holds the same number of full KV heads in every layer.

Serving frameworks (vLLM) split a layer's KV heads into `tp_size` contiguous shards, one per rank. Ranks run
in lock step and share one KV cache layout, so a layer whose shards hold different numbers of full heads
would leave the rank with the most full heads deciding everybody's memory and time. `balanced_plan`
chooses, per layer, a multiple of `tp_size` full heads and, in each shard, its highest-scoring heads; across
layers it spends full heads where they score highest (greedy on whole "one more full head per rank" units,
whose values fall within a layer, so the greedy choice is the best one). It keeps at least as many full heads
as the plain plan at the same sparsity. `with_fewer_bounded` keeps more of a plan's heads full, in the
profile's order; `unbalanced_layers` names the layers of a plan that is not balanced.
"""

from __future__ import annotations

import math

from ..errors import PlanError
from ..policies import Full
from .head_order import bounded_order, tie_losses
from .plan import Plan, plan


def shards(num_kv_heads: int, tp_size: int) -> list[range]:
    """The KV heads of each rank (contiguous, as vLLM splits them); `tp_size` must divide `num_kv_heads`."""
    if tp_size < 1 or num_kv_heads % tp_size:
        raise PlanError(
            f"tensor parallel size {tp_size} does not divide the model's {num_kv_heads} KV heads: a duocal plan gives "
            f"each rank whole KV heads; use a size that divides {num_kv_heads}"
        )
    per = num_kv_heads // tp_size
    return [range(r * per, (r + 1) * per) for r in range(tp_size)]


def balanced_full_heads(scores, tp_size: int, num_full: int) -> set[tuple[int, int]]:
    """(layer, kv_head) pairs kept full: ceil(num_full / tp_size) units of one head per rank, best units first.
    scores[layer][kv_head]: higher means more retrieval (the profile's gates)."""
    ranked = []  # per layer, per rank: its heads, best first
    for row in scores:
        ranked.append([sorted(shard, key=lambda h, row=row: (-row[h], h)) for shard in shards(len(row), tp_size)])
    units = [
        (-sum(row[ranks[r][j]] for r in range(tp_size)), j, layer)
        for layer, (row, ranks) in enumerate(zip(scores, ranked, strict=True))
        for j in range(len(ranks[0]))
    ]
    chosen = sorted(units)[: math.ceil(num_full / tp_size)]
    return {(layer, ranked[layer][r][j]) for _, j, layer in chosen for r in range(tp_size)}


def balanced_plan(profile, tp_size: int, sparsity: float | None = None, **sizes) -> Plan:
    """The plan of `plan(profile, sparsity=..., **sizes)` with its full heads chosen so that every one of
    `tp_size` ranks holds the same number per layer (at least as many full heads in all)."""
    plain = plan(profile, sparsity=sparsity, **sizes)
    bounded = [p for row in plain.policies for p in row if p.name != "full"]
    if not bounded:
        return plain
    full = next((p for row in plain.policies for p in row if p.name == "full"), Full())
    num_full = sum(p.name == "full" for row in plain.policies for p in row)
    keep = balanced_full_heads(profile.scores, tp_size, num_full)
    table = [
        [full if (layer, head) in keep else bounded[0] for head in range(len(row))]
        for layer, row in enumerate(plain.policies)
    ]
    return Plan(plain.shape, table, plain.model_name)


def with_fewer_bounded(plan: Plan, profile, bounded: int, tp_size: int = 1) -> Plan:
    """`plan` with only `bounded` of its bounded heads left bounded: the best-scored of the others kept full
    instead, in the profile's own order (ties as `dr.plan` breaks them), whole heads per rank when `tp_size` > 1
    (every rank the same full heads per layer). `plan`'s bounded heads share one policy."""
    flat = [p for row in plan.policies for p in row]
    now = [i for i, p in enumerate(flat) if p.name != "full"]
    if not 0 <= bounded <= len(now) or len({flat[i] for i in now}) > 1:
        raise PlanError(f"cannot leave {bounded} of {len(now)} bounded heads of one policy bounded")
    if bounded == len(now):
        return plan
    policy, full = flat[now[0]], next((p for p in flat if p.name == "full"), Full())
    kv, bounded_now = len(plan.policies[0]), set(now)
    if tp_size > 1:
        keep = balanced_full_heads(profile.scores, tp_size, len(flat) - bounded)
        still = {i for i in now if (i // kv, i % kv) not in keep}
    else:
        scores = [s for row in profile.scores for s in row]
        still = set([i for i in bounded_order(scores, tie_losses(profile, policy)) if i in bounded_now][:bounded])
    if len(still) != bounded:
        raise PlanError(f"{bounded} bounded heads cannot be balanced over {tp_size} ranks")
    table = [[policy if layer * kv + h in still else full for h in range(kv)] for layer in range(len(plan.policies))]
    return Plan(plan.shape, table, plan.model_name)


def unbalanced_layers(is_full: list[list[bool]], tp_size: int) -> list[str]:
    """'layer 3 (1/0)' for each layer whose ranks hold different numbers of full heads; [] when balanced."""
    uneven = []
    for layer, row in enumerate(is_full):
        counts = [sum(row[h] for h in shard) for shard in shards(len(row), tp_size)]
        if len(set(counts)) > 1:
            uneven.append(f"layer {layer} ({'/'.join(map(str, counts))})")
    return uneven

"""A profile summarised for people (`duocal profiles show`) and for tools (`--json`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

import duocal_runtime as dr
from duocal_runtime.planning.sizes import human_bytes

from .terminal import simple_head_box
from .tune_report import finite_text
from .tuned_record import STALE, UNREADABLE, UNVERIFIED, tuned_state

HISTOGRAM_BINS = 10


def score_histogram(scores: list[float], bins: int = HISTOGRAM_BINS) -> list[int]:
    counts = [0] * bins
    for s in scores:
        counts[min(int(s * bins), bins - 1)] += 1
    return counts


def _bounded_policy(plan: dr.Plan) -> dict[str, Any] | None:
    bounded = (p for row in plan.policies for p in row if p.bounded)
    policy = next(bounded, None)
    return policy.to_dict() if policy is not None else None


def tie_report(profile: dr.Profile, plan: dr.Plan) -> dict[str, Any]:
    """How many bounded heads a tie-break chose (among how many heads of equal score) and by what. A
    budget's mix chooses by predicted loss, not in score order: it reports no ties."""
    from duocal_runtime.planning.head_order import tie_losses, tied_at_cut

    if plan.choice is not None:
        return {"tie_decided_heads": 0, "tied_heads": 0, "ties_broken_by": "the mix's predicted loss"}
    bounded = {i for i, p in enumerate(p for row in plan.policies for p in row) if p.bounded}
    chosen, among = tied_at_cut(profile.flat_scores(), bounded)
    policy = next(p for row in plan.policies for p in row if p.bounded) if bounded else None
    measured = policy is not None and tie_losses(profile, policy) is not None
    return {
        "tie_decided_heads": chosen,
        "tied_heads": among,
        "ties_broken_by": "measured loss" if measured else "head index",
    }


def profile_summary(
    profile: dr.Profile,
    sparsity: float | None = None,
    context: int = 32768,
    context_from: str = "--context",
    budget: str | None = None,
    policies: tuple[str, ...] | None = None,
    dtype: str = "bfloat16",
    kv_bits: int = 16,
) -> dict[str, Any]:
    """Everything `profiles show` prints; memory is for batch 1, `dtype`, at `context` tokens, full
    heads storing `kv_bits`. With `budget` (and `policies`, default full + the profile's policy),
    the plan is the budget's mix."""
    from duocal_runtime.planning.head_order import check_head_choice  # torch: not at the CLI's start

    check_head_choice(sparsity=sparsity, budget=budget)
    if context < 1:
        raise ValueError(f"--context must be a positive number of tokens, got {context}")
    if budget is not None:
        plan = dr.plan(
            profile,
            budget=budget,
            context=context,
            policies=policies or ("full", profile.deploy.policy),
            dtype=dtype,
            kv_bits=kv_bits,
        )
    else:
        plan = dr.plan(profile, sparsity=sparsity, kv_bits=kv_bits)
    memory = plan.memory_report(context, batch=1, dtype=dtype)
    counts: dict[str, int] = {}
    for row in plan.policies:
        for p in row:
            counts[p.label] = counts.get(p.label, 0) + 1
    return {
        "model": profile.model.name_or_path,
        "architecture": profile.model.architecture,
        "num_layers": profile.shape.num_hidden_layers,
        "num_kv_heads": profile.shape.num_key_value_heads,
        "num_attention_heads": profile.shape.num_attention_heads,
        "head_dim": profile.shape.head_dim,
        "fingerprint": profile.shape.fingerprint,
        "source": profile.source.get("kind"),
        "score": profile.source.get("score"),  # what ranked the heads, for a profiler's profile
        "sparsity": plan.sparsity,
        "policy": _bounded_policy(plan),
        "retrieval_heads_per_layer": plan.retrieval_heads_per_layer,
        "score_histogram": score_histogram(profile.flat_scores()),
        "context": context,
        "context_from": context_from,
        "dtype": memory["dtype"],
        "kv_bits": kv_bits,
        "kv_bytes_full": memory["kv_bytes_full"],
        "kv_bytes_plan": memory["kv_bytes_plan"],
        "fraction_of_full": memory["fraction_of_full"],
        "policy_counts": counts,
        **tie_report(profile, plan),
        "measurements": sorted(profile.measurements),
        "tuned": tuned_summary(profile),
    }


def tuned_summary(profile: dr.Profile) -> dict[str, Any] | None:
    """How `duocal tune` chose the deploy sparsity (its record without the timings), if it did, and its
    `state`: current, stale (the profile changed since), unverified (no digest) or unreadable."""
    record, state = tuned_state(profile)
    if record is None:
        return None if state is None else {"state": state}
    keys = ("at", "data", "context", "dtype", "rule", "measured_pick", "chosen_sparsity", "margin")
    columns = ("sparsity", "fraction_of_full", "loss", "exact", "lost", "total")
    summary = {"state": state, **{k: record.get(k) for k in keys}}
    summary["table"] = [{k: p.get(k) for k in columns} for p in record["table"]]
    if record.get("confirmation"):
        rows = [{k: p.get(k) for k in columns} for p in record["confirmation"]["table"]]
        summary["confirmation"] = {"data": record["confirmation"]["data"], "table": rows}
    return summary


def policy_text(policy: dict[str, Any] | None) -> str:
    """{'policy': 'sink_window', 'sink': 64, 'recent': 512} -> 'sink_window (sink 64, recent 512)'."""
    if policy is None:
        return "none (every head is full)"
    sizes = ", ".join(f"{key} {value}" for key, value in policy.items() if key != "policy")
    return f"{policy['policy']} ({sizes})" if sizes else str(policy["policy"])


def render_summary(s: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    console.print(
        f"[bold]{escape(str(s['model'] or 'unnamed model'))}[/] ({escape(str(s['architecture'] or '?'))}), "
        f"source: {escape(str(s['source']))}" + (f" (scores: {escape(str(s['score']))})" if s.get("score") else "")
    )
    console.print(
        f"{s['num_layers']} layers x {s['num_kv_heads']} KV heads ({s['num_attention_heads']} query heads, "
        f"head_dim {s['head_dim']}), fingerprint {s['fingerprint']}"
    )
    hist = Table(title="score histogram", show_edge=False, box=simple_head_box(console))
    for i in range(HISTOGRAM_BINS):
        hist.add_column(f"{i / HISTOGRAM_BINS:.1f}", justify="right")
    hist.add_row(*map(str, s["score_histogram"]))
    console.print(hist)
    console.print(
        f"sparsity {s['sparsity']:.3f} -> retrieval heads per layer: "
        f"{' '.join(map(str, s['retrieval_heads_per_layer']))}"
    )
    console.print(f"bounded heads' policy: {policy_text(s['policy'])}")
    console.print("KV heads per policy: " + ", ".join(f"{name} {n}" for name, n in s["policy_counts"].items()))
    if s["measurements"]:
        console.print(f"measurements: {', '.join(s['measurements'])}")
    if s.get("tie_decided_heads"):
        hint = "" if s["ties_broken_by"] != "head index" else " (add measurements: duocal profile --scores-from)"
        console.print(
            f"{s['tie_decided_heads']} bounded heads were chosen among {s['tied_heads']} heads of equal score, "
            f"by {s['ties_broken_by']}{hint}"
        )
    if s.get("tuned"):
        render_tuned(s["tuned"], console)
    if s.get("context_from", "--context") != "--context":
        console.print(f"context {s['context']} tokens: {escape(s['context_from'])}")
    console.print(
        f"KV cache at {s['context']} tokens (batch 1, {s['dtype']}"
        + (f", full heads in {s['kv_bits']}-bit codes" if s.get("kv_bits", 16) != 16 else "")
        + f"): {human_bytes(s['kv_bytes_plan'])} vs "
        f"{human_bytes(s['kv_bytes_full'])} full ({s['fraction_of_full']:.1%})"
    )


def render_tuned(t: dict[str, Any], console: Console) -> None:
    """Lines that say how `duocal tune` chose the deploy sparsity; one line when its record is unreadable
    or stale (it does not describe this profile)."""
    if t["state"] == UNREADABLE:
        console.print("the duocal tune record (source.tuned) is unreadable: run duocal tune again")
        return
    if t["state"] == STALE:
        console.print(
            f"a duocal tune record ({escape(str(t.get('at')))}, sparsity {t['chosen_sparsity']:g}) is stale: the "
            "scores, measurements or deploy settings changed since; run duocal tune again to choose on them"
        )
        return
    data = t.get("data") or {}
    console.print(
        f"deploy sparsity {t['chosen_sparsity']:g} chosen by duocal tune ({escape(str(t.get('at')))}) on "
        f"{escape(str(data.get('name')))} ({data.get('items')} items, {escape(str(data.get('fingerprint')))})"
    )
    if t["state"] == UNVERIFIED:
        console.print(
            "  unverified: the record predates its profile digest, so a later change of the scores or the "
            "deploy settings cannot be detected"
        )
    console.print(f"  rule: {escape(str((t.get('rule') or {}).get('text')))}")
    render_tuned_rows(t["table"], console)
    confirmation = t.get("confirmation")
    if confirmation and confirmation["table"]:
        pick = t.get("measured_pick")
        console.print(
            f"  the measuring set's pick {pick if pick is None else format(pick, 'g')}, confirmed on "
            f"{escape(str(confirmation['data'].get('name')))} ({confirmation['data'].get('items')} items):"
        )
        render_tuned_rows(confirmation["table"], console)


def render_tuned_rows(rows: list[dict[str, Any]], console: Console) -> None:
    for p in rows:
        exact = "" if p.get("exact") is None else f", exact {p['exact']}/{p['total']}"
        exact += "" if p.get("lost") is None else f", lost {p['lost']} of full attention's"
        loss = finite_text(p["loss"], "{:.4f}")
        console.print(f"  sparsity {p['sparsity']:g}: KV {p['fraction_of_full']:.2f} of full, loss {loss}{exact}")

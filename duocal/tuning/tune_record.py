"""The profile `duocal tune` writes: the input profile with the chosen sparsity as its deploy default and
the measurement it was chosen on in `source["tuned"]` (data fingerprint, rule, table, and the digest of
the scores, measurements and deploy settings it was measured on, so a later change reads as stale).

`source` is the profile's free-form record of how it was made, so the record needs no new format
version: every reader of version 3 (and the runtime's `dr.plan`, `duocal serve`, the vLLM engine,
which read `deploy`) loads the file as before; `duocal profiles show` prints the record.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import duocal_runtime as dr
from duocal.reports.tuned_record import DIGEST, TUNED, measured_digest

from .tune_data import TuneData
from .tune_prompts import CONFIRM_LENGTHS, confirming_seed
from .tune_rule import CurvePoint, Rule, choose, choose_confirmed, full_point, margin


def tune_record(
    data: TuneData,
    rule: Rule,
    measured: list[CurvePoint],
    confirmed: list[CurvePoint] | None,
    context: int,
    dtype: str,
    model: str,
) -> dict[str, Any]:
    """The measurement as the profile records it: both sets' tables, the measuring set's pick, the sparsity that
    holds on both (`chosen_sparsity`, what deploys) and its margin on each set."""
    chosen = choose_confirmed(measured, confirmed, rule)
    return {
        "by": "duocal tune",
        "at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "model": model,
        "data": {**data.describe(), "items": measured[0].total},
        "context": context,
        "dtype": dtype,
        "rule": rule.to_dict(),
        "measured_pick": choose(measured, rule),
        "chosen_sparsity": chosen,
        "table": [p.to_dict() for p in measured],
        "confirmation": {
            "data": {"name": confirming_set(data), "items": confirmed[0].total if confirmed else 0},
            "table": [p.to_dict() for p in confirmed or []],
        },
        "scored": {"measuring": scored(measured, rule), "confirming": scored(confirmed, rule) if confirmed else None},
        "margin": {
            "measuring": margin(measured, chosen, rule),
            "confirming": margin(confirmed, chosen, rule) if confirmed else None,
        },
    }


def scored(points: list[CurvePoint], rule: Rule) -> dict[str, Any]:
    """What a set scored: its items, full attention's right answers among them and how many the rule lets a
    sparsity lose (None where exact match is not measured)."""
    full = full_point(points)
    allowed = None if full.exact is None else rule.allowed_losses(full.exact)
    return {"items": full.total, "full_right": full.exact, "allowed_losses": allowed}


def confirming_set(data: TuneData) -> str:
    if data.kind == "passkey":
        lengths = " and ".join(f"{x:g}x" for x in CONFIRM_LENGTHS)
        return f"the same kinds of prompt, other keys (seed {confirming_seed(data.seed)}), at {lengths} --context"
    items = "text windows" if data.kind == "text" else "conversations"
    return f"the 2nd, 4th, ... {items} of {data.name} (the 1st, 3rd, ... measure)"


def tuned_profile(profile: dr.Profile, record: dict[str, Any]) -> dr.Profile:
    """`profile` deploying `record`'s chosen sparsity, the record in its source (a former one replaced) with
    the digest of the profile it describes."""
    deployed = profile.with_deploy(sparsity=record["chosen_sparsity"])
    return replace(deployed, source={**profile.source, TUNED: {**record, DIGEST: measured_digest(deployed)}})

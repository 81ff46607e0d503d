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
from .tune_rule import CurvePoint, Rule


def tune_record(
    data: TuneData, rule: Rule, points: list[CurvePoint], chosen: float, context: int, dtype: str, model: str
) -> dict[str, Any]:
    return {
        "by": "duocal tune",
        "at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "model": model,
        "data": {**data.describe(), "items": points[0].total},
        "context": context,
        "dtype": dtype,
        "rule": rule.to_dict(),
        "chosen_sparsity": chosen,
        "table": [p.to_dict() for p in points],
    }


def tuned_profile(profile: dr.Profile, record: dict[str, Any]) -> dr.Profile:
    """`profile` deploying `record`'s chosen sparsity, the record in its source (a former one replaced) with
    the digest of the profile it describes."""
    deployed = profile.with_deploy(sparsity=record["chosen_sparsity"])
    return replace(deployed, source={**profile.source, TUNED: {**record, DIGEST: measured_digest(deployed)}})

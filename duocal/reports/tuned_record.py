"""The record `duocal tune` leaves in a profile's `source["tuned"]`, read back and checked.

`source` is free-form, so a record may be badly shaped: it then reads as unreadable (one line in
`profiles show`, never a traceback; the profile still deploys). Any later writer (a re-ranking, the
profiler's `--scores-from`, a hand edit) may change what the record was measured on, so the record
carries `profile_sha256`, a digest of the scores, the measurements (they break ties between equal
scores) and the deploy settings (sparsity, policy, sizes): a profile that no longer matches reads as
stale, never as tuned. A record older than the digest reads as unverified.
"""

from __future__ import annotations

import hashlib
import json
from numbers import Real
from typing import Any

TUNED = "tuned"  # the key of `duocal tune`'s record in a profile's source
DIGEST = "profile_sha256"  # the key of the digest of what the record was measured on

CURRENT, STALE, UNVERIFIED, UNREADABLE = "current", "stale", "unverified", "unreadable"


def measured_digest(profile) -> str:
    """sha256 of a canonical JSON of what a tuning measured and chose: the scores, the measurements and
    the deploy settings of `profile` (a `dr.Profile`); not its name, nor its free-form source."""
    data = profile.to_dict()
    measured = {key: data.get(key) for key in ("scores", "measurements", "deploy")}
    text = json.dumps(measured, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def tuned_state(profile) -> tuple[dict[str, Any] | None, str | None]:
    """(the record, its state) for `profile`: (None, None) without a record, (None, UNREADABLE) for a
    badly shaped one, else the record and CURRENT, STALE (the profile changed since) or UNVERIFIED (no
    digest to check against)."""
    if TUNED not in profile.source:
        return None, None
    record = profile.source[TUNED]
    if not readable(record):
        return None, UNREADABLE
    digest = record.get(DIGEST)
    if digest is None:
        return record, UNVERIFIED
    return record, CURRENT if digest == measured_digest(profile) else STALE


def readable(record: Any) -> bool:
    """A record `profiles show` can print: a number `chosen_sparsity`, rows with number `sparsity` and
    `fraction_of_full` and a number or null `loss` (the confirming set's too, where given), `data`, `rule` and
    `margin` objects where given."""
    return (
        isinstance(record, dict)
        and _number(record.get("chosen_sparsity"))
        and isinstance(record.get("table"), list)
        and all(_readable_row(row) for row in record["table"])
        and all(record.get(key) is None or isinstance(record[key], dict) for key in ("data", "rule", "margin"))
        and isinstance(record.get(DIGEST, ""), str)
        and _readable_confirmation(record.get("confirmation"))
    )


def _readable_confirmation(confirmation: Any) -> bool:
    """None (a record from before the confirming set), or its data and rows."""
    return confirmation is None or (
        isinstance(confirmation, dict)
        and isinstance(confirmation.get("data"), dict)
        and isinstance(confirmation.get("table"), list)
        and all(_readable_row(row) for row in confirmation["table"])
    )


def _readable_row(row: Any) -> bool:
    return (
        isinstance(row, dict)
        and _number(row.get("sparsity"))
        and _number(row.get("fraction_of_full"))
        and (row.get("loss") is None or _number(row.get("loss")))
    )


def _number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)

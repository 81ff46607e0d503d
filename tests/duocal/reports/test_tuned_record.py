"""`duocal tune`'s record read back by `profiles show`: a badly shaped record is one line, never a
traceback (the profile still deploys); a profile changed after tuning (re-ranked scores, the profiler's
`--scores-from` measurements, other deploy settings) reads as stale, never as "chosen by duocal tune";
a record older than the digest reads as unverified."""

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.cli import app
from duocal.profiling.profiler import with_measurements
from duocal.reports.tuned_record import DIGEST, TUNED
from duocal.tuning.tune_record import tuned_profile
from duocal_runtime.profile.measurements import Measurement

from helpers.profiles import random_profile

ROWS = [
    {"sparsity": 0.0, "fraction_of_full": 1.0, "loss": 2.0, "exact": None, "total": 3},
    {"sparsity": 0.5, "fraction_of_full": 0.6, "loss": None, "exact": None, "total": 3},
]
RECORD = {
    "at": "2026-12-05T09:00:00Z",
    "data": {"kind": "text", "name": "book.txt", "fingerprint": "sha256:ab", "items": 3},
    "rule": {"text": "loss within 0.05 nats of full attention"},
    "chosen_sparsity": 0.5,
    "table": ROWS,
}
CLAIM = "deploy sparsity 0.5 chosen by duocal tune"


def tuned():
    return tuned_profile(random_profile(layers=2, kv_heads=2, seed=5), RECORD)


def show(profile, tmp_path, *more):
    path = dr.save_profile(profile, tmp_path / "p.json")
    result = CliRunner().invoke(app, ["profiles", "show", str(path), *more])
    assert result.exit_code == 0 and result.exception is None, result.output
    return result.stdout


def show_text(profile, tmp_path):
    """`profiles show`'s lines as one line (the terminal wraps long ones)."""
    return " ".join(show(profile, tmp_path).split())


def state(profile, tmp_path):
    return json.loads(show(profile, tmp_path, "--json"))["tuned"]


def test_a_tuned_profile_is_current_after_saving_and_loading(tmp_path):
    assert state(tuned(), tmp_path)["state"] == "current"
    shown = show_text(tuned(), tmp_path)
    assert CLAIM in shown and "stale" not in shown and "unverified" not in shown


BAD_RECORDS = {
    "not an object": [1],
    "table of numbers": {**RECORD, "table": [1]},
    "empty row": {**RECORD, "table": [{}]},
    "no chosen sparsity": {k: v for k, v in RECORD.items() if k != "chosen_sparsity"},
    "chosen sparsity text": {**RECORD, "chosen_sparsity": "0.5"},
    "chosen sparsity true": {**RECORD, "chosen_sparsity": True},
    "no table": {k: v for k, v in RECORD.items() if k != "table"},
    "loss text": {**RECORD, "table": [{**ROWS[0], "loss": "2.0"}]},
    "fraction missing": {**RECORD, "table": [{"sparsity": 0.0, "loss": 2.0}]},
    "data a list": {**RECORD, "data": ["book.txt"]},
    "rule a string": {**RECORD, "rule": "tolerance"},
}


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_a_badly_shaped_record_is_one_line_and_the_profile_still_deploys(case, tmp_path):
    profile = random_profile(layers=2, kv_heads=2, seed=5)
    profile = replace(profile, source={**profile.source, TUNED: BAD_RECORDS[case]})
    shown = show(profile, tmp_path)
    assert [line for line in shown.splitlines() if "tune" in line] == [
        "the duocal tune record (source.tuned) is unreadable: run duocal tune again"
    ]
    assert state(profile, tmp_path) == {"state": "unreadable"}
    assert dr.plan(dr.load_profile(tmp_path / "p.json")).sparsity == pytest.approx(profile.deploy.sparsity)


def measured_profile(profile: dr.Profile) -> dr.Profile:
    """What `duocal profile --scores-from` measured: a measurement and other sink-window sizes."""
    table = [[0.25, 0.75] for _ in range(profile.shape.num_hidden_layers)]
    measured = replace(profile, measurements={"kept:sink_window": Measurement(table)})
    return measured.with_deploy(dr.SinkWindow(sink=4, recent=32))


CHANGES = {
    "scores re-ranked": lambda p: replace(p, scores=tuple(tuple(1.0 - s for s in row) for row in p.scores)),
    "profiler measurements": lambda p: with_measurements(p, measured_profile(p)),
    "deploy sparsity": lambda p: p.with_deploy(sparsity=0.75),
    "deploy policy": lambda p: p.with_deploy(policy="h2o"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_profile_changed_after_tuning_reads_as_stale(change, tmp_path):
    changed = CHANGES[change](tuned())
    assert changed.source[TUNED] == tuned().source[TUNED]  # the writer kept the record
    shown = show_text(changed, tmp_path)
    assert CLAIM not in shown and "is stale" in shown, shown
    assert state(changed, tmp_path)["state"] == "stale"


def test_a_record_without_a_digest_is_shown_as_unverified(tmp_path):
    profile = tuned()
    old = {k: v for k, v in profile.source[TUNED].items() if k != DIGEST}
    profile = replace(profile, source={**profile.source, TUNED: old})
    shown = show_text(profile, tmp_path)
    assert CLAIM in shown and "unverified" in shown
    assert state(profile, tmp_path)["state"] == "unverified"

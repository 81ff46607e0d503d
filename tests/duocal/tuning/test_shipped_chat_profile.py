"""The shipped chat profile of SmolLM2-135M-Instruct (`profiles/smollm2-135m-instruct-chat.json`, issue 48): the
quick-start profile (what `duocal profile smollm2-135m-instruct` makes; tests/data/quick-start, checked on chat
prompts by tests/test_real_model.py) tuned by `duocal tune` on its default prompts, so it deploys the sparsity the
rule picks without a flag and `profiles show` prints how it was chosen."""

from importlib import resources
from pathlib import Path

import duocal_runtime as dr
from duocal.reports.tuned_record import CURRENT, tuned_state
from duocal.tuning.tune_rule import CurvePoint, Rule, choose

SHIPPED = Path(str(resources.files("duocal_runtime.prebuilt") / "smollm2-135m-instruct-chat.json"))
QUICK_START = Path(__file__).parents[2] / "data" / "quick-start" / "smollm2-135m-instruct.json"


def test_the_shipped_chat_profile_has_the_quick_start_profiles_heads():
    shipped, quick = dr.load_profile(SHIPPED), dr.load_profile(QUICK_START)
    assert shipped.scores == quick.scores and shipped.measurements == quick.measurements
    assert {k: v for k, v in shipped.source.items() if k != "tuned"} == quick.source


def test_the_shipped_chat_profile_deploys_what_its_tuning_rule_picks_on_its_table():
    profile = dr.load_profile(SHIPPED)
    record, state = tuned_state(profile)
    assert state == CURRENT  # the record was measured on these scores and deploy settings
    points = [CurvePoint.from_dict(row) for row in record["table"]]
    rule = Rule(record["rule"]["tolerance_nats"], record["rule"]["max_miss"])
    assert profile.deploy.sparsity == record["chosen_sparsity"] == choose(points, rule) == 0.75
    assert dr.plan(profile).num_bounded == 68  # planned at 0.75 without a sparsity given: 68 of 90 KV heads

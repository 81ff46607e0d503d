"""The rule `duocal tune` chooses by, on hand-made curves: the largest sparsity within the tolerance of full
attention (loss and exact match), never past a break, the highest one on a flat curve, 0 when none passes."""

import math

import pytest

from duocal.tuning.tune_rule import CurvePoint, Rule, choose, choose_confirmed, margin, to_confirm


def curve(*rows, total=16):
    """(sparsity, loss, exact[, lost]) rows -> points (KV bytes fall as sparsity rises); without `lost`, every
    answer a sparsity misses beyond full attention's (the first row) is one full attention gave."""
    full_exact = rows[0][2]
    return [
        CurvePoint(s, int(1000 * (1 - s / 2)), 1 - s / 2, r[0], r[1], total, 0.0, lost(r, full_exact)) for s, *r in rows
    ]


def lost(row, full_exact):
    if len(row) == 3:
        return row[2]
    return None if row[1] is None else max(0, full_exact - row[1])


def test_the_largest_sparsity_within_both_tolerances_is_chosen():
    points = curve(
        (0.0, 0.20, 14), (0.25, 0.21, 14), (0.5, 0.24, 13), (0.625, 0.26, 13), (0.75, 0.30, 12), (0.875, 0.9, 3)
    )
    assert choose(points, Rule(tolerance=0.05, max_miss=0.125)) == 0.5  # 0.625: +0.06 nats
    assert choose(points, Rule(tolerance=0.1, max_miss=0.125)) == 0.625  # 0.75: 2 of full's 14 lost, 1 allowed
    assert choose(points, Rule(tolerance=0.1, max_miss=0.1875)) == 0.75


def test_a_flat_curve_chooses_the_highest_sparsity():
    points = curve(*[(s, 0.3, 10) for s in (0.0, 0.25, 0.5, 0.625, 0.75, 0.875)])
    assert choose(points, Rule()) == 0.875
    assert choose(list(reversed(points)), Rule(tolerance=0.0, max_miss=0.0)) == 0.875


def test_a_curve_that_breaks_and_recovers_is_not_chosen_past_the_break():
    points = curve((0.0, 0.2, 8), (0.25, 0.2, 8), (0.5, 0.5, 8), (0.75, 0.2, 8))
    assert choose(points, Rule()) == 0.25


def test_no_passing_sparsity_deploys_full_attention():
    points = curve((0.0, 0.2, 16), (0.5, 0.8, 4), (0.75, 1.2, 1))
    assert choose(points, Rule()) == 0.0


def test_exact_match_counts_full_attentions_right_answers_lost():
    rule = Rule(tolerance=1.0, max_miss=0.125)
    assert rule.allowed_losses(16) == 2 and rule.allowed_losses(8) == 1 and rule.allowed_losses(7) == 0
    assert choose(curve((0.0, 0.2, 16), (0.5, 0.2, 14), (0.75, 0.2, 13)), rule) == 0.5
    assert choose(curve((0.0, 0.2, 10), (0.5, 0.2, 9), (0.75, 0.2, 8)), rule) == 0.5  # 1 of 10 allowed


def test_answers_gained_on_some_prompts_do_not_make_up_for_answers_lost_on_others():
    rule = Rule(tolerance=1.0, max_miss=0.125)
    # 0.5 answers as many prompts as full attention, but 3 of full attention's 12 are among those it misses
    traded = curve((0.0, 0.2, 12), (0.25, 0.2, 13, 1), (0.5, 0.2, 12, 3), (0.75, 0.2, 16, 0))
    assert choose(traded, rule) == 0.25


def test_a_record_without_lost_answers_is_refused_not_judged_by_counts():
    old = [CurvePoint(0.0, 1000, 1.0, 0.2, 12, 16), CurvePoint(0.5, 750, 0.75, 0.2, 12, 16)]
    with pytest.raises(ValueError, match="run duocal tune again"):
        choose(old, Rule())


def test_the_record_keeps_lost_answers_but_not_each_prompts_answer():
    point = CurvePoint(0.5, 750, 0.75, 0.2, 2, 3, 1.0, 1, (True, False, True))
    assert point.to_dict()["lost"] == 1 and "answered" not in point.to_dict()
    assert CurvePoint.from_dict(point.to_dict()).lost == 1


def test_text_curves_without_exact_match_are_chosen_by_loss_alone():
    points = curve((0.0, 2.0, None), (0.5, 2.04, None), (0.75, 2.06, None))
    assert choose(points, Rule(tolerance=0.05)) == 0.5


def test_a_nan_loss_never_passes_and_is_stored_as_null():
    points = curve((0.0, 0.2, 8), (0.5, math.nan, 8))
    assert choose(points, Rule()) == 0.0
    assert points[1].to_dict()["loss"] is None and math.isnan(CurvePoint.from_dict(points[1].to_dict()).loss)


@pytest.mark.parametrize(
    "kwargs, message",
    [({"tolerance": -0.1}, "--tolerance"), ({"tolerance": math.inf}, "--tolerance"), ({"max_miss": 1.5}, "--max-miss")],
)
def test_bad_rule_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Rule(**kwargs)


def test_a_curve_without_full_attention_is_refused():
    with pytest.raises(ValueError, match="full-attention point"):
        choose(curve((0.5, 0.2, 8)), Rule())


MEASURED = ((0.0, 0.2, 8), (0.5, 0.2, 8), (0.625, 0.21, 8), (0.75, 0.22, 8), (0.875, 0.23, 7), (0.9375, 0.5, 2))


def test_the_confirming_set_measures_the_pick_and_every_smaller_sparsity():
    assert to_confirm((0.5, 0.625, 0.75, 0.875, 0.9375), 0.875) == (0.5, 0.625, 0.75, 0.875)
    assert to_confirm((0.75, 0.5), 0.5) == (0.5,) and to_confirm((0.5,), 0.0) == ()


def test_a_pick_the_confirming_set_holds_deploys():
    measured = curve(*MEASURED)
    assert choose(measured, Rule()) == 0.875
    confirmed = curve((0.0, 0.3, 8), (0.5, 0.3, 8), (0.625, 0.3, 8), (0.75, 0.31, 8), (0.875, 0.32, 7))
    assert choose_confirmed(measured, confirmed, Rule()) == 0.875


def test_a_confirming_set_that_fails_at_the_pick_drops_it():
    confirmed = curve((0.0, 0.3, 8), (0.5, 0.3, 8), (0.625, 0.3, 8), (0.75, 0.31, 8), (0.875, 0.32, 5))
    assert choose_confirmed(curve(*MEASURED), confirmed, Rule()) == 0.75


def test_a_hole_below_the_pick_on_the_confirming_set_drops_the_pick_below_the_hole():
    """The confirming set recovers at 0.75 and 0.875 but loses 3 answers at 0.625: 0.5 deploys."""
    confirmed = curve((0.0, 0.3, 8), (0.5, 0.3, 8), (0.625, 0.3, 5), (0.75, 0.3, 8), (0.875, 0.3, 8))
    assert choose_confirmed(curve(*MEASURED), confirmed, Rule()) == 0.5
    loss_hole = curve((0.0, 0.3, 8), (0.5, 0.45, 8), (0.625, 0.3, 8), (0.75, 0.3, 8), (0.875, 0.3, 8))
    assert choose_confirmed(curve(*MEASURED), loss_hole, Rule()) == 0.0


def test_the_confirming_set_never_lifts_the_pick():
    confirmed = curve((0.0, 0.3, 8), (0.5, 0.3, 8), (0.625, 0.3, 8), (0.75, 0.3, 8), (0.875, 0.3, 8), (0.9375, 0.3, 8))
    assert choose_confirmed(curve(*MEASURED), confirmed, Rule()) == 0.875


def test_an_unconfirmed_pick_or_a_sparsity_missing_below_it_is_refused():
    with pytest.raises(ValueError, match="not been confirmed"):
        choose_confirmed(curve(*MEASURED), None, Rule())
    partial = curve((0.0, 0.3, 8), (0.5, 0.3, 8), (0.875, 0.3, 8))
    with pytest.raises(ValueError, match=r"did not measure sparsity 0\.625"):
        choose_confirmed(curve(*MEASURED), partial, Rule())
    assert choose_confirmed(curve((0.0, 0.2, 8), (0.5, 0.9, 1)), None, Rule()) == 0.0  # nothing to confirm


def test_the_margin_is_what_the_rule_still_allows_at_a_sparsity():
    points = curve(*MEASURED)
    assert margin(points, 0.875, Rule()) == {"loss_nats": 0.02, "answers": 0}
    assert margin(points, 0.5, Rule(tolerance=0.1, max_miss=0.25)) == {"loss_nats": 0.1, "answers": 2}
    assert margin(points, 0.3, Rule()) is None

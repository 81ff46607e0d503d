"""The question after the context: the context's prefill never sees the question, every question is
asked on its own copy of the compressed cache, and rows say which protocol they used."""

import json

import pytest
import torch
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.cli import app
from duocal.data.passkey import TokenKind
from duocal.eval import passkey_retrieval as pk
from duocal.eval.protocols import answers_in_turns, answers_on_copies, protocols_of
from duocal.measure.decoding import question_start
from duocal.models import ModelRef


@pytest.fixture(scope="module")
def demo_with_profile(demo_model):
    return (*demo_model, dr.load_profile(ModelRef.resolve(None).default_profile))


def test_the_context_is_prefilled_without_its_question(demo_with_profile):
    model, tok, profile = demo_with_profile
    sample = pk.make_samples(tok, 512, pk.PasskeyEvalConfig(samples=1))[0]
    start = question_start(sample)
    assert sample.kinds[start] == TokenKind.QUESTION and TokenKind.QUESTION not in sample.kinds[:start]
    with dr.apply(model, dr.plan(profile, sparsity=0.5)) as runtime:
        asked = answers_on_copies(model, runtime, sample)
        assert asked.seen == [start]  # the question's tokens never reached the context's prefill
        twice = answers_on_copies(model, runtime, sample)
    assert twice.answers == asked.answers and asked.kv_bytes > 0  # copies are independent


def several_questions(tok, samples=1, context=512):
    config = pk.PasskeyEvalConfig(samples=samples, questions="all", num_passkeys=(3, 3))
    return pk.make_samples(tok, context, config)


def test_every_question_on_its_own_copy_is_the_question_alone_after_the_context(demo_with_profile):
    model, tok, _profile = demo_with_profile
    sample = several_questions(tok)[0]
    assert len(sample.answers) == 3 and next(a.asked_at for a in sample.answers) == question_start(sample)
    with dr.apply(model, dr.uniform_plan(dr.shape_of_config(model.config), dr.Full())) as runtime:
        asked = answers_on_copies(model, runtime, sample)
        start = question_start(sample)
        for answer, got in zip(
            sample.answers, asked.answers, strict=True
        ):  # the same as prefilling context + that question
            alone = sample.input_ids[:start] + sample.input_ids[answer.asked_at : answer.start]
            cache = runtime.new_cache()
            out = model.generate(input_ids=torch.tensor([alone]), cache=cache, max_new_tokens=len(answer.ids))
            assert tuple(out[0, len(alone) :].tolist()) == got
    assert asked.seen == [start] * 3


def test_multi_turn_asks_in_sequence_on_one_cache_after_the_models_own_answers(demo_with_profile):
    model, tok, profile = demo_with_profile
    sample = several_questions(tok)[0]
    with dr.apply(model, dr.plan(profile, sparsity=0.5)) as runtime:
        turns = answers_in_turns(model, runtime, sample)
    start, answers = question_start(sample), sample.answers
    # before turn i the cache has seen the context, every earlier turn and the model's earlier answers
    # (but the last answer token, which is fed with the next turn): never the coming question
    expected, fed, turn_start = [], start, start
    for answer, got in zip(answers, turns.answers, strict=True):
        expected.append(fed - 1 if expected else fed)
        fed, turn_start = fed + answer.start - turn_start + len(got), answer.end
    assert turns.seen == expected and turns.kv_bytes > 0
    with dr.apply(model, dr.uniform_plan(dr.shape_of_config(model.config), dr.Full())) as runtime:
        full = answers_in_turns(model, runtime, sample)
        # full attention in turns equals one prefill of the whole conversation
        ids = list(sample.input_ids[:start])
        turn_start = start
        for answer, got in zip(answers, full.answers, strict=True):
            ids += sample.input_ids[turn_start : answer.start]
            out = model.generate(input_ids=torch.tensor([ids]), cache=runtime.new_cache(), max_new_tokens=len(got))
            assert tuple(out[0, len(ids) :].tolist()) == got
            ids, turn_start = ids + list(got), answer.end


def test_rows_of_both_protocols_and_a_query_aware_policy_loses_more_after_the_context(demo_with_profile):
    model, tok, profile = demo_with_profile
    config = pk.PasskeyEvalConfig(
        rows=("full", "duo", "snapkv"), sparsities=(0.75,), contexts=(512,), samples=6, protocol="both"
    )
    rows = pk.evaluate_passkey(model, tok, config, profile=profile)
    by = {(r.row, r.protocol): r.exact_match for r in rows}
    assert set(by) == {(row, p) for row in ("full", "duo", "snapkv") for p in protocols_of("both")}
    assert by[("full", "query-agnostic")] == by[("full", "query-aware")]  # full attention keeps everything either way
    # the head split does not depend on the query: within one sample of 6 (the sink windows see other tokens)
    assert abs(by[("duo", "query-agnostic")] - by[("duo", "query-aware")]) <= 1 / 6 + 1e-9


def test_cli_protocol_option_and_its_json(demo_with_profile):
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "passkey",
            "--rows",
            "full",
            "--contexts",
            "256",
            "--samples",
            "2",
            "--protocol",
            "query-agnostic",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert [r["protocol"] for r in json.loads(result.stdout)] == ["query-agnostic"]
    bad = CliRunner().invoke(app, ["eval", "passkey", "--protocol", "later", "--no-plot"])
    assert bad.exit_code == 1 and "unknown protocol 'later'" in bad.stderr


def test_all_questions_in_all_three_protocols_are_scored_per_question(demo_with_profile):
    model, tok, profile = demo_with_profile
    config = pk.PasskeyEvalConfig(
        rows=("full", "duo"), sparsities=(0.5,), contexts=(384,), samples=2, protocol="all", questions="all"
    )
    rows = pk.evaluate_passkey(model, tok, config, profile=profile)
    asked = sum(len(s.answers) for s in pk.make_samples(tok, 384, config))
    assert asked > 2 and {r.questions for r in rows} == {asked} and {r.samples for r in rows} == {2}
    assert {(r.row, r.protocol) for r in rows} == {(row, p) for row in ("full", "duo") for p in protocols_of("all")}
    for r in rows:  # exact match is a fraction of the questions asked
        assert round(r.exact_match * asked, 6) == round(r.exact_match * asked)


def test_multi_turn_needs_several_questions_and_ruler_has_one_per_prompt():
    with pytest.raises(ValueError, match="questions='all'"):
        pk.PasskeyEvalConfig(protocol="multi-turn")
    with pytest.raises(ValueError, match="questions must be 'one' or 'all'"):
        pk.PasskeyEvalConfig(questions="some")
    from duocal.eval.ruler import RulerConfig

    with pytest.raises(ValueError, match="unknown protocol 'multi-turn'"):
        RulerConfig(protocol="multi-turn")


def test_cli_multi_turn(demo_with_profile):
    args = ["eval", "passkey", "--rows", "full", "--contexts", "256", "--samples", "2", "--passkeys", "2"]
    result = CliRunner().invoke(app, [*args, "--protocol", "multi-turn", "--questions", "all", "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert row["protocol"] == "multi-turn" and row["questions"] == 4 and row["samples"] == 2
    bad = CliRunner().invoke(app, [*args, "--protocol", "multi-turn", "--no-plot"])
    assert bad.exit_code == 1 and "questions='all'" in bad.stderr

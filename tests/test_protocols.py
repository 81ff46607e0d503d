"""The question after the context: the context's prefill never sees the question, every question is
asked on its own copy of the compressed cache, and rows say which protocol they used."""

import json

import pytest
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.cli import app
from duocal.data.passkey import TokenKind
from duocal.eval import passkey_retrieval as pk
from duocal.eval.protocols import answer_after_the_context, protocols_of, question_start
from duocal.models import ModelRef


@pytest.fixture(scope="module")
def demo():
    ref = ModelRef.resolve(None)
    return ref.load_model(), ref.load_tokenizer(), dr.load_profile(ref.default_profile)


def test_the_context_is_prefilled_without_its_question(demo):
    model, tok, profile = demo
    sample = pk.make_samples(tok, 512, pk.PasskeyEvalConfig(samples=1))[0]
    start = question_start(sample)
    assert sample.kinds[start] == TokenKind.QUESTION and TokenKind.QUESTION not in sample.kinds[:start]
    with dr.apply(model, dr.plan(profile, sparsity=0.5)) as runtime:
        answer, nbytes, seen = answer_after_the_context(
            model, runtime, sample.prompt_ids, start, len(sample.answer_ids)
        )
        assert seen == start  # the question's tokens never reached the context's prefill
        twice = answer_after_the_context(model, runtime, sample.prompt_ids, start, len(sample.answer_ids))
    assert twice[0] == answer and nbytes > 0  # copies are independent: asking again gives the same answer


def test_rows_of_both_protocols_and_a_query_aware_policy_loses_more_after_the_context(demo):
    model, tok, profile = demo
    config = pk.PasskeyEvalConfig(
        rows=("full", "duo", "snapkv"), sparsities=(0.75,), contexts=(512,), samples=6, protocol="both"
    )
    rows = pk.evaluate_passkey(model, tok, config, profile=profile)
    by = {(r.row, r.protocol): r.exact_match for r in rows}
    assert set(by) == {(row, p) for row in ("full", "duo", "snapkv") for p in protocols_of("both")}
    assert by[("full", "query-agnostic")] == by[("full", "query-aware")]  # full attention keeps everything either way
    # the head split does not depend on the query: within one sample of 6 (the sink windows see other tokens)
    assert abs(by[("duo", "query-agnostic")] - by[("duo", "query-aware")]) <= 1 / 6 + 1e-9


def test_cli_protocol_option_and_its_json(demo):
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

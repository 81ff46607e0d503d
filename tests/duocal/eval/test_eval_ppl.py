"""`duocal eval ppl`: perplexity through the per-head cache, scored in chunks as the policy runs."""

import json
import math
import os

import pytest
import torch
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.cli.app import app
from duocal.demo import DEMO_MODEL_DIR
from duocal.eval.perplexity import PerplexityConfig, evaluate_perplexity
from duocal.measure.text_windows import text_windows

TEXT = "the quick brown fox jumps over the lazy dog while the passkey waits. " * 40


def test_full_row_equals_the_plain_model_and_a_sink_window_wider_than_the_context_changes_nothing(demo_model):
    model, tokenizer = demo_model
    config = PerplexityConfig(
        rows=("full", "streaming"), context=300, scored=200, chunk=7, text_windows=2, sink=100, recent=200
    )
    rows = {r.row: r for r in evaluate_perplexity(model, tokenizer, TEXT, config)}
    losses = []
    with torch.no_grad():
        for text_window in text_windows(tokenizer, TEXT, 300, 2):
            logits = model(input_ids=text_window[None]).logits[0, -201:-1]
            losses.append(torch.nn.functional.cross_entropy(logits, text_window[-200:], reduction="none"))
    plain = math.exp(float(torch.cat(losses).mean()))
    assert rows["full"].ppl == pytest.approx(plain, rel=1e-5)
    assert rows["streaming"].ppl == pytest.approx(plain, rel=1e-5)  # sink + recent = context: nothing evicted
    assert rows["full"].tokens_scored == 400


def test_evicting_policies_change_the_loss_and_rows_carry_their_bytes(demo_model):
    model, tokenizer = demo_model
    profile = dr.load_profile(str(DEMO_MODEL_DIR.parents[2] / "profiles" / "demo-model.json"))
    config = PerplexityConfig(
        rows=("full", "duo", "streaming", "h2o", "random"),
        sparsities=(0.5,),
        context=400,
        chunk=50,
        text_windows=1,
        random_seeds=2,
    )
    rows = {r.row: r for r in evaluate_perplexity(model, tokenizer, TEXT, config, profile=profile)}
    assert rows["streaming"].ppl != pytest.approx(rows["full"].ppl, rel=1e-6)
    assert rows["duo"].kv_bytes == rows["random"].kv_bytes < rows["full"].kv_bytes
    assert rows["h2o"].kv_bytes <= rows["duo"].kv_bytes and len(rows["random"].per_seed) == 2


def test_kv_bits_rows_quantize_full_heads_only_and_count_their_bytes(demo_model):
    model, tokenizer = demo_model
    profile = dr.load_profile(str(DEMO_MODEL_DIR.parents[2] / "profiles" / "demo-model.json"))
    config = PerplexityConfig(
        rows=("full", "duo", "streaming"),
        sparsities=(0.5,),
        context=400,
        chunk=50,
        text_windows=1,
        kv_bits=(16, 8, 4),
        baselines=("hqq8", "hqq4"),
    )
    rows = {(r.row, r.kv_bits): r for r in evaluate_perplexity(model, tokenizer, TEXT, config, profile=profile)}
    assert set(rows) == {(row, bits) for row in ("full", "duo") for bits in (16, 8, 4)} | {
        ("streaming", 16),
        ("hqq8", 8),
        ("hqq4", 4),
    }
    for bits in (8, 4):  # transformers' QuantizedCache: quantized too (its bytes measured from its cache)
        baseline = rows[f"hqq{bits}", bits]
        assert baseline.ppl != rows["full", 16].ppl and baseline.ppl == pytest.approx(rows["full", 16].ppl, rel=0.1)
        assert baseline.kv_bytes < 0.6 * rows["full", 16].kv_bytes and baseline.sparsity == 0
    assert rows["hqq4", 4].kv_bytes < rows["hqq8", 8].kv_bytes
    for row in ("full", "duo"):
        assert rows[row, 4].kv_bytes < rows[row, 8].kv_bytes < rows[row, 16].kv_bytes
        assert rows[row, 8].ppl == pytest.approx(rows[row, 16].ppl, rel=0.02)  # 8 bits: hardly a change
        assert rows[row, 8].ppl != rows[row, 16].ppl  # ... but a real one: tokens beyond the residual are quantized
    shape = dr.shape_of_config(model.config)
    want = dr.uniform_plan(shape, dr.Full(kv_bits=4, group=math.gcd(32, shape.head_dim))).kv_bytes(400, 1, model.dtype)
    assert rows["full", 4].kv_bytes == want


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(context=100, scored=100), "scored must be between 1 and context - 1"),
        (dict(rows=("full", "fast")), "unknown row 'fast'"),
        (dict(chunk=0), "chunk must be at least 1"),
        (dict(sparsities=(1.5,)), "sparsity must be in"),
        (dict(kv_bits=(16, 3)), "kv bits must be distinct values of 16, 8 and 4, got 16, 3"),
        (dict(kv_bits=(8, 8)), "kv bits must be distinct"),
        (dict(baselines=("quanto8",)), "unknown QuantizedCache row 'quanto8'"),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PerplexityConfig(**kwargs)


def test_cli_json_rows_and_clear_errors(tmp_path):
    runner = CliRunner()
    text = tmp_path / "story.txt"
    text.write_text(TEXT)
    out = runner.invoke(
        app,
        [
            "eval",
            "ppl",
            "--text",
            str(text),
            "--context",
            "256",
            "--text-windows",
            "1",
            "--rows",
            "full,streaming",
            "--baselines",
            "hqq4",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    assert [r["row"] for r in rows] == ["full", "streaming", "hqq4"] and rows[2]["kv_bits"] == 4
    assert set(rows[0]) >= {"row", "sparsity", "context", "tokens_scored", "ppl", "kv_bytes"}
    short = runner.invoke(app, ["eval", "ppl", "--text", str(text), "--context", "4000"])
    assert short.exit_code == 1 and "fewer than one text window of 4000" in short.output
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00bad")
    bad = runner.invoke(app, ["eval", "ppl", "--text", str(tmp_path / "bin.txt")])
    assert bad.exit_code == 1 and "bin.txt is not UTF-8 text" in bad.output
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)  # reading it would block until killed: refused before any work
    hung = runner.invoke(app, ["eval", "ppl", "--text", str(fifo)])
    assert hung.exit_code == 1 and "is a fifo, not a regular file" in hung.output
    for args in (
        ["profile", "--data", "text", "--text", str(fifo), "--output", str(tmp_path / "p.json")],
        ["eval", "passkey", "--haystack", str(fifo), "--no-plot"],
    ):
        refused = runner.invoke(app, args)
        assert refused.exit_code == 1 and "is a fifo" in refused.output, args


def test_past_the_trained_length_only_rows_that_stream_are_evaluated(tiny_llama_folder):
    """The tiny model is trained on 1,024 positions: the streaming row (positions within the cache) reads a
    2,048-token text window; a row with full heads is refused before any work, naming itself."""
    args = ["eval", "ppl", "--model", str(tiny_llama_folder), "--context", "2048", "--text-windows", "1"]
    result = CliRunner().invoke(app, [*args, "--rows", "streaming", "--sink", "4", "--recent", "60", "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert row["row"] == "streaming" and row["context"] == 2048 and math.isfinite(row["ppl"])
    result = CliRunner().invoke(app, [*args, "--rows", "streaming,full"])
    assert result.exit_code == 1
    assert "beyond the model's max_position_embeddings (1024): rows full have heads that see original" in result.output
    assert "--rows streaming" in result.output


def test_duo_and_random_rows_see_the_positions_asked_and_the_profiles_by_default():
    from dataclasses import replace

    from duocal.eval.row_kinds import RowInputs, build_rows

    from helpers.profiles import random_profile

    profile = random_profile()
    inputs = lambda config, p: RowInputs(p.shape, 64, config.sink_window(p), p)  # noqa: E731
    rows = build_rows(("duo", "random", "streaming"), (0.5,), inputs(PerplexityConfig(positions="cache"), profile))
    sink_windows = {r.row: {p for plan in r.plans for row in plan.policies for p in row if p.bounded} for r in rows}
    assert all(p.positions == "cache" for kinds in sink_windows.values() for p in kinds)
    rows = build_rows(("duo", "streaming"), (0.5,), inputs(PerplexityConfig(), profile))
    assert [{p.positions for plan in r.plans for row in plan.policies for p in row if p.bounded} for r in rows] == [
        {"original"},
        {"cache"},  # StreamingLLM's row always
    ]
    streaming_profile = replace(profile, deploy=profile.deploy.with_sizes(dr.SinkWindow(positions="cache")))
    assert PerplexityConfig().sink_window(streaming_profile).positions == "cache"
    result = CliRunner().invoke(app, ["eval", "ppl", "--positions", "nearby"])
    assert result.exit_code == 1 and "positions must be 'original'" in result.output

"""`duocal eval passkey`: plans at matching budgets, batching, the JSON contract, bad options."""

import json

import pytest
import torch
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal import models
from duocal.cli import app
from duocal.data.padding import pad_batch, pad_token_id
from duocal.demo import DEMO_MODEL_DIR
from duocal.eval import passkey_retrieval as pk
from duocal.eval import row_kinds as variants
from duocal.eval.passkey_retrieval import PasskeyEvalConfig

from helpers.profiles import random_profile

runner = CliRunner()
SHAPE = dr.ModelShape(4, 8, 4, 16)
SINK_WINDOW = dr.SinkWindow(sink=8, recent=32)
ROW_KEYS = {
    "row",
    "context",
    "sparsity",
    "exact_match",
    "kv_bytes",
    "kv_bytes_measured",
    "kv_bytes_full",
    "fraction_of_full",
    "samples",
    "bounded_heads",
    "num_heads",
}


# --- plans ----------------------------------------------------------------------------------
@pytest.mark.parametrize("sparsity", [0.0, 0.25, 0.5, 0.75, 1.0])
@pytest.mark.parametrize("context", [200, 512, 1024])
def test_h2o_matches_the_duo_budget(sparsity, context):
    profile = random_profile(layers=4, kv_heads=4, heads=8, head_dim=16)
    duo = variants.duo_plan(profile, sparsity, SINK_WINDOW)
    target = duo.kv_tokens(context)
    assert variants.matched_tokens(SHAPE, sparsity, SINK_WINDOW, context) == target  # any head choice costs the same
    h2o = variants.h2o_plan(SHAPE, target, context)
    assert all(isinstance(p, dr.H2O) for row in h2o.policies for p in row)
    # at most the duo bytes, and short of them by less than one token per head
    assert target - SHAPE.num_kv_heads_total < h2o.kv_tokens(context) <= target
    assert h2o.kv_bytes(context, 1, "float32") <= duo.kv_bytes(context, 1, "float32")


def test_random_plans_draw_the_same_count_differently_and_reproducibly():
    plans = variants.random_plans(SHAPE, 0.75, SINK_WINDOW, seeds=[0, 1, 2])
    streaming = [
        frozenset(i for i, p in enumerate(p for row in plan.policies for p in row) if not isinstance(p, dr.Full))
        for plan in plans
    ]
    assert [len(s) for s in streaming] == [12, 12, 12]
    assert len(set(streaming)) == 3
    assert variants.random_plans(SHAPE, 0.75, SINK_WINDOW, seeds=[0, 1, 2]) == plans


def test_variants_cover_policy_by_sparsity():
    profile = random_profile(layers=4, kv_heads=4, heads=8, head_dim=16)
    config = PasskeyEvalConfig(sparsities=(0.25, 0.5), random_seeds=2)
    inputs = variants.RowInputs(SHAPE, 512, SINK_WINDOW, profile, config.random_seeds)
    rows = variants.build_rows(config.rows, config.sparsities, inputs, {"mine": dr.uniform_plan(SHAPE, SINK_WINDOW)})
    assert [(v.row, v.sparsity, len(v.plans)) for v in rows] == [
        ("full", 0.0, 1),
        ("duo", 0.25, 1),
        ("duo", 0.5, 1),
        ("streaming", 1.0, 1),
        ("h2o", 0.25, 1),
        ("h2o", 0.5, 1),
        ("random", 0.25, 2),
        ("random", 0.5, 2),
        ("mine", 1.0, 1),
    ]
    duo = rows[2].plans[0]
    assert duo.num_bounded == 8 and duo == dr.plan(profile, sparsity=0.5, policy="sink_window", sink=8, recent=32)


def test_pad_batch_left_right_and_multiple():
    ids, mask = pad_batch([(5, 6, 7), (8,)], 0, left=True)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.long().tolist() == [[1, 1, 1], [0, 0, 1]]
    ids, mask = pad_batch([(5, 6, 7), (8,)], -1, multiple=4)
    assert ids.tolist() == [[5, 6, 7, -1], [8, -1, -1, -1]]
    assert mask.long().tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]


def test_the_sink_window_defaults_to_the_profile():
    profile = random_profile().with_deploy(dr.SinkWindow(4, 12))
    assert PasskeyEvalConfig().sink_window(profile) == dr.SinkWindow(4, 12)
    assert PasskeyEvalConfig(recent=20).sink_window(profile) == dr.SinkWindow(4, 20)
    assert PasskeyEvalConfig().sink_window(None) == dr.SinkWindow(64, 256)


# --- running --------------------------------------------------------------------------------
def test_batched_answers_equal_answers_alone(tiny_llama_folder):
    """Left-padded batches give every row the tokens it gets alone (prompts of unequal length)."""
    model, tokenizer = models.load_model(tiny_llama_folder), models.load_tokenizer(tiny_llama_folder)
    config = PasskeyEvalConfig(format="digits", samples=2)
    samples = pk.make_samples(tokenizer, 600, config) + pk.make_samples(tokenizer, 520, config)
    pad = pad_token_id(tokenizer, model.config)
    plan = dr.plan_from_bounded_set(dr.shape_of_config(model.config), {1, 2}, SINK_WINDOW)
    with dr.apply(model, plan) as runtime:
        together, _ = pk.greedy_answers(model, runtime, pk.make_batches(samples, 4, pad)[0], pad)
        alone = [pk.greedy_answers(model, runtime, pk.make_batches([s], 1, pad)[0], pad)[0][0] for s in samples]
    assert together == alone


def test_rows_and_bytes(tiny_llama_folder):
    model, tokenizer = models.load_model(tiny_llama_folder), models.load_tokenizer(tiny_llama_folder)
    config = PasskeyEvalConfig(
        rows=("full", "streaming", "h2o", "random"),
        sparsities=(0.5,),
        contexts=(512,),
        samples=3,
        sink=8,
        recent=32,
        random_seeds=2,
        format="digits",
    )
    seen = []
    rows = pk.evaluate_passkey(model, tokenizer, config, progress=lambda d, t, label: seen.append((d, t)))
    assert [r.row for r in rows] == ["full", "streaming", "h2o", "random"]
    assert seen[-1] == (15, 15) and all(d <= t for d, t in seen)
    full_bytes = 512 * 2 * 2 * 2 * 8 * 4  # context x layers x KV heads x (K, V) x head_dim x fp32
    by = {r.row: r for r in rows}
    assert by["full"].kv_bytes == by["full"].kv_bytes_full == full_bytes
    assert by["streaming"].kv_bytes == 40 * 4 * 2 * 8 * 4
    # sink + recent and H2O heads store exactly their budget; full heads hold the sequence plus slack
    assert by["streaming"].kv_bytes_measured == by["streaming"].kv_bytes
    assert by["h2o"].kv_bytes_measured == by["h2o"].kv_bytes
    assert 0.98 * full_bytes <= by["full"].kv_bytes_measured <= 1.05 * full_bytes
    assert by["random"].seeds == [0, 1] and by["random"].min <= by["random"].exact_match <= by["random"].max


def test_kv_bits_rows_hold_their_codes_and_say_their_bits(tiny_llama_folder, tmp_path):
    model, tokenizer = models.load_model(tiny_llama_folder), models.load_tokenizer(tiny_llama_folder)
    config = PasskeyEvalConfig(
        rows=("full", "streaming"), contexts=(512,), samples=2, sink=8, recent=32, format="digits", kv_bits=(16, 4)
    )
    rows = pk.evaluate_passkey(model, tokenizer, config)
    assert [(r.row, r.kv_bits) for r in rows] == [("full", 16), ("full", 4), ("streaming", 16)]
    quantized = dr.uniform_plan(dr.shape_of_config(model.config), dr.Full(kv_bits=4, group=8))
    assert rows[1].kv_bytes == quantized.kv_bytes(512, 1, torch.float32) < 0.6 * rows[0].kv_bytes  # 128 fp32 residual
    assert rows[1].kv_bytes <= rows[1].kv_bytes_measured <= 1.05 * rows[1].kv_bytes
    one_sample = "--contexts 512 --samples 1 --rows full --format digits --kv-bits 16,8 --no-plot".split()
    result = runner.invoke(app, ["eval", "passkey", "--model", str(tiny_llama_folder), *one_sample])
    assert result.exit_code == 0, result.output
    assert "full kv8" in result.stdout
    bad = runner.invoke(app, ["eval", "passkey", "--model", str(tiny_llama_folder), "--kv-bits", "2", "--no-plot"])
    assert bad.exit_code == 1 and "kv bits must be distinct values of 16, 8 and 4, got 2" in bad.output


# --- CLI ------------------------------------------------------------------------------------
def test_cli_json_schema(tiny_llama_folder, tmp_path):
    plot = tmp_path / "plot.png"
    profile = dr.save_profile(random_profile(layers=2, kv_heads=2, heads=4, head_dim=8), tmp_path / "p.json")
    result = runner.invoke(
        app,
        [
            "eval",
            "passkey",
            "--model",
            str(tiny_llama_folder),
            "--profile",
            str(profile),
            "--contexts",
            "512",
            "--samples",
            "2",
            "--sparsity",
            "0.5,1",
            "--sink",
            "8",
            "--recent",
            "32",
            "--random-seeds",
            "2",
            "--json",
            "--plot",
            str(plot),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)  # stdout is nothing but the JSON list
    assert isinstance(rows, list)
    assert [(r["row"], r["sparsity"]) for r in rows] == [
        ("full", 0.0),
        ("duo", 0.5),
        ("duo", 1.0),
        ("streaming", 1.0),
        ("h2o", 0.5),
        ("h2o", 1.0),
        ("random", 0.5),
        ("random", 1.0),
    ]
    for r in rows:
        assert ROW_KEYS <= set(r), r
        assert r["context"] == 512 and r["samples"] == 2 and 0.0 <= r["exact_match"] <= 1.0
        assert isinstance(r["kv_bytes"], int) and r["fraction_of_full"] == pytest.approx(
            r["kv_bytes"] / r["kv_bytes_full"]
        )
    for r in rows:
        if r["row"] == "random":
            assert r["seeds"] == [0, 1] and r["min"] <= r["exact_match"] <= r["max"] and len(r["per_seed"]) == 2
    duo = {r["sparsity"]: r for r in rows if r["row"] == "duo"}
    assert duo[1.0]["kv_bytes"] == rows[3]["kv_bytes"]  # every head streaming = StreamingLLM
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_table(tiny_llama_folder, tmp_path):
    table = "--contexts 512 --samples 1 --rows full,streaming --no-plot --sink 8 --recent 32".split()
    result = runner.invoke(app, ["eval", "passkey", "--model", str(tiny_llama_folder), *table])
    assert result.exit_code == 0, result.output
    assert "exact" in result.stdout and "streaming" in result.stdout and "0/4 full" in result.stdout
    assert "4/4 sink_window 8+32" in result.stdout and "(cache)" in result.stdout  # StreamingLLM's positions
    rows = [line.split()[0] for line in result.stdout.splitlines() if line.split()[:1] in (["full"], ["streaming"])]
    assert rows == ["full", "streaming"], result.stdout  # the reference first
    assert "exact match: share of answers that are the key" in result.stdout  # what the columns mean
    # not a terminal: plain lines (done / total, elapsed), never a bar redrawn into the file
    assert "passkey: 2/2 (100%), " in result.stderr and "━" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rows", "full,magic"], "unknown row 'magic'"),
        (["--sparsity", "0.5,1.5"], "sparsity must be in [0, 1]"),
        (["--sparsity", "half"], "cannot read --sparsity"),
        (["--contexts", "512,2048"], "beyond the model's max_position_embeddings (1024)"),
        (["--samples", "0"], "samples must be at least 1"),
        (["--rows", "full,duo"], "row 'duo' needs a profile"),
        (["--contexts", "100"], "raise context_length"),
        (["--sink", "0"], "sink must be a positive"),
    ],
)
def test_cli_bad_options(tiny_llama_folder, monkeypatch, args, message):
    monkeypatch.setattr("duocal.models.resolve.ModelRef.load_model", lambda *a: pytest.fail("loaded the weights"))
    result = runner.invoke(app, ["eval", "passkey", "--model", str(tiny_llama_folder), "--no-plot", *args])
    assert result.exit_code != 0
    assert message in result.stderr, result.output


def test_cli_profile_of_another_model(tiny_llama_folder, tmp_path, monkeypatch):
    monkeypatch.setattr("duocal.models.resolve.ModelRef.load_model", lambda *a: pytest.fail("loaded the weights"))
    other = dr.save_profile(random_profile(layers=4, kv_heads=2, heads=4, head_dim=8), tmp_path / "other.json")
    result = runner.invoke(app, ["eval", "passkey", "--model", str(tiny_llama_folder), "--profile", str(other)])
    assert result.exit_code == 1
    assert "profile is for 4 layers" in result.stderr and "2 layers" in result.stderr


def test_cli_demo_defaults(tmp_path):
    """The demo model is the default; its shipped profile (when there is one) is the default for duo."""
    from duocal.models import ModelRef

    result = runner.invoke(
        app,
        [
            "eval",
            "passkey",
            "--contexts",
            "512",
            "--samples",
            "2",
            "--sparsity",
            "0.5",
            "--random-seeds",
            "1",
            "--json",
            "--no-plot",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    shipped = ModelRef.resolve(DEMO_MODEL_DIR).default_profile
    want = ["full", "duo", "streaming", "h2o", "random"] if shipped else ["full", "streaming", "h2o", "random"]
    assert [r["row"] for r in rows] == want
    assert rows[0]["exact_match"] >= 0.5  # 2 held-out samples at 512 tokens: the demo model retrieves

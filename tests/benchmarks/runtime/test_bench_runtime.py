"""The runtime benchmark runs every row kind and reports what the README's table shows."""

import json

import pytest

import duocal_runtime as dr
from benchmarks.runtime import rows as R
from benchmarks.runtime.__main__ import add_ratios, parse_args, rows_in_process


@pytest.mark.slow
def test_benchmark_rows_on_the_tiny_shape():
    rows = "dynamic,full,stream50,mixed50,h2o50,static,stream50-compiled,mixed50-compiled"
    args = parse_args(
        [
            "--shape",
            "tiny",
            "--contexts",
            "600",
            "--rows",
            rows,
            "--steps",
            "4",
            "--warmup",
            "2",
            "--prefill-runs",
            "1",
            "--peak-bandwidth",
            "1e10",
        ]
    )
    results = rows_in_process(args)
    add_ratios(results, args.peak_bandwidth)
    by_row = {r["row"]: r for r in results}
    assert list(by_row) == rows.split(",")
    assert all(r["decode_tok_s"] > 0 and 0 < r["bw_frac"] and r["kv_vs_min"] <= 1.02 for r in results)
    assert by_row["dynamic"]["decode_speedup"] == 1.0
    assert by_row["stream50"]["kv_vs_dynamic"] < 0.8 and by_row["h2o50"]["kv_vs_dynamic"] < 0.8
    assert "prefill_s" in by_row["full"] and "prefill_s" not in by_row["static"]  # compiled rows: decode only
    static = by_row["stream50-compiled"]  # preallocated: full heads hold max_length slots, streaming their window
    assert static["kv_bytes"] == pytest.approx(static["kv_bytes_min"], rel=0.02)
    assert by_row["mixed50"]["kv_bytes"] == by_row["stream50"]["kv_bytes"]  # the same heads' worth, elsewhere
    assert by_row["mixed50-compiled"]["kv_bytes"] == static["kv_bytes"]


def test_mixed_rows_put_both_policies_in_one_layer_and_stream_rows_do_not():
    shape = dr.ModelShape(32, 32, 8, 128)  # Llama-3-8B's heads
    mixes = {row: [len({p.name for p in layer}) == 2 for layer in R.row_plan(row, shape, 4096).policies] for row in (
        "stream50", "stream75", "mixed50", "mixed75")}  # fmt: skip
    assert not any(mixes["stream50"]) and not any(mixes["stream75"])
    assert sum(mixes["mixed50"]) >= 16 and sum(mixes["mixed75"]) >= 8
    assert R.row_plan("mixed50", shape, 4096) == R.row_plan("mixed50", shape, 4096)  # seeded


def test_quantized_rows_hold_their_analytic_bytes_and_name_their_plan():
    rows = "dynamic,full,full-kv8,full-kv4,stream50-kv4,hqq8"
    args = parse_args(["--shape", "tiny", "--contexts", "4500", "--rows", rows, "--max-prefill", "0"])
    args.steps, args.warmup = (
        14,
        1,
    )  # 4352 tokens quantized after the fill; the 12th step codes 32 more (the buffers grow)
    results = rows_in_process(args)
    add_ratios(results, None)
    by_row = {r["row"]: r for r in results}
    for row in ("full-kv8", "full-kv4", "stream50-kv4"):  # growth slack: 1/64 rounded to whole groups
        assert by_row[row]["kv_bytes"] == pytest.approx(by_row[row]["kv_bytes_min"], rel=0.02)
    assert by_row["full-kv4"]["kv_vs_dynamic"] < by_row["full-kv8"]["kv_vs_dynamic"] < 0.6
    assert by_row["stream50-kv4"]["kv_bytes"] < by_row["full-kv4"]["kv_bytes"]
    assert R.kv_bits_of("stream50-kv4") == ("stream50", 4) and R.kv_bits_of("full") == ("full", 16)
    hqq = by_row["hqq8"]  # transformers' QuantizedCache (HQQ): codes, fp32 scales and zeros per 32, a residual
    assert hqq["decode_tok_s"] > 0 and 0.9 < hqq["kv_bytes"] / by_row["full-kv8"]["kv_bytes"] < 1.1


def test_max_context_table_multiplies_sparsity_and_bits(capsys):
    from benchmarks.runtime import max_context

    max_context.main(["--shape", "tiny", "--kv-memory", "1GB", "--sparsity", "0,0.5", "--kv-bits", "16,4"])
    lines = capsys.readouterr().out.splitlines()
    cells = {tuple(line.split(" | ")[:2]): line.split(" | ")[2] for line in lines[2:]}
    assert cells["16", "0%"].endswith("(1.0x)") and cells["16", "50%"].endswith("(2.0x)")
    assert cells["4", "0%"].endswith("(3.2x)") and cells["4", "50%"].endswith("(6.4x)")
    with pytest.raises(dr.PlanError, match="memory must be bytes"):
        max_context.main(["--shape", "tiny", "--kv-memory", "1000 tokens"])


def test_unknown_rows_and_shapes_are_refused(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--rows", "dynamic,fast"])
    assert "unknown rows" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--shape", "gpt5"])
    assert set(R.ROWS) >= {"dynamic", "static", "full", "stream50", "stream75", "h2o50", "full-compiled"}


@pytest.mark.slow
def test_first_call_benchmark_runs_each_row_in_a_fresh_process(tmp_path, capsys, tiny_llama):
    """Rows plain and duo50 on a tiny saved Llama: a table with plain at 1.00x and JSON with both rows."""
    import duocal_runtime as dr
    from benchmarks.runtime import first_call

    from helpers.profiles import random_profile

    model = tiny_llama
    model.save_pretrained(tmp_path / "model")
    shape = dr.shape_of_config(model.config)
    profile = random_profile(
        shape.num_hidden_layers, shape.num_key_value_heads, shape.num_attention_heads, shape.head_dim
    )
    dr.save_profile(profile, tmp_path / "p.json")
    out = tmp_path / "rows.json"
    first_call.main(
        [
            "--model",
            str(tmp_path / "model"),
            "--profile",
            str(tmp_path / "p.json"),
            "--prompt",
            "40",
            "--new",
            "3",
            "--rows",
            "plain,duo50",
            "--out",
            str(out),
        ]
    )
    rows = {r["row"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"plain", "duo50"}
    assert all(0 < r["generate_s"] < r["process_s"] for r in rows.values())
    table = capsys.readouterr().out
    assert "plain" in table and "1.00x" in table and "duo50" in table
    with pytest.raises(SystemExit):
        first_call.main(["--model", "m", "--profile", "p", "--rows", "plain,turbo"])


@pytest.mark.slow
def test_serving_benchmark_serves_every_request_and_keeps_each_row_it_measured(tmp_path, capsys, tiny_llama):
    """A tiny saved Llama through transformers' continuous batching: every request's tokens come back,
    duo rows hold fewer bytes per request than plain, and the JSON is written after each row."""
    import duocal_runtime as dr
    from benchmarks.runtime import serving

    from helpers.profiles import random_profile

    model = tiny_llama
    model.save_pretrained(tmp_path / "model")
    shape = dr.shape_of_config(model.config)
    profile = random_profile(
        shape.num_hidden_layers, shape.num_key_value_heads, shape.num_attention_heads, shape.head_dim
    )
    dr.save_profile(profile.with_deploy(dr.SinkWindow(4, 16)), tmp_path / "p.json")
    out = tmp_path / "serving.json"
    args = ["--model", str(tmp_path / "model"), "--profile", str(tmp_path / "p.json"), "--requests", "4"]
    rows = "plain,duo75,duo75-kv4"
    serving.main([*args, "--prompt", "64:96", "--new", "2:4", "--rows", rows, "--out", str(out)])
    data = json.loads(out.read_text())
    rows = {r["row"]: r for r in data["rows"]}
    news = [r.new for r in serving.workload(4, (64, 96), (2, 4), "burst", model.config.vocab_size)]
    assert set(rows) == {"plain", "duo75", "duo75-kv4"} and all(r["output_tokens"] == sum(news) for r in rows.values())
    assert 0 < rows["duo75"]["kv_bytes_per_request"] < rows["plain"]["kv_bytes_per_request"]
    assert rows["duo75-kv4"]["kv_bytes_per_request"] > 0  # short prompts: the residual's ring outweighs the codes
    with pytest.raises(ValueError, match="unknown serving row 'duo80'"):  # refused before any work
        serving.main([*args, "--rows", "plain,duo80", "--out", str(tmp_path / "other.json")])
    assert all(1 <= r["held_max"] <= 4 and r["tok_per_s"] > 0 for r in rows.values())
    assert "duo75" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"--out .* is a folder"):  # refused before any work
        serving.main([*args, "--out", str(tmp_path)])


def test_serving_benchmark_on_random_weights_of_a_shape_plans_mixed_layers(tmp_path):
    """`--shape` serves random weights with seeded random scores (what a GPU run uses at 8B): its duo plans put
    heads of both policies in one layer, as real profiles do, and every request's tokens come back."""
    from transformers import LlamaConfig

    from benchmarks.runtime import serving
    from benchmarks.runtime.shapes import SHAPES, random_scores_profile

    out = tmp_path / "serving.json"
    args = ["--shape", "tiny", "--requests", "3", "--prompt", "900:1000", "--new", "2:3", "--rows", "plain,duo50"]
    serving.main([*args, "--out", str(out)])
    rows = {r["row"]: r for r in json.loads(out.read_text())["rows"]}
    news = [r.new for r in serving.workload(3, (900, 1000), (2, 3), "burst", 1000)]
    assert all(r["output_tokens"] == sum(news) for r in rows.values())
    assert rows["duo50"]["kv_bytes_per_request"] < rows["plain"]["kv_bytes_per_request"]
    config = LlamaConfig(**SHAPES["llama3-8b"])  # the shape a GPU run serves (no weights needed for its plan)
    plan = dr.plan(random_scores_profile(config), sparsity=0.5)
    assert any(len({p.name for p in row}) == 2 for row in plan.policies), "no layer mixes policies"
    assert random_scores_profile(config).scores == random_scores_profile(config).scores  # seeded
    with pytest.raises(SystemExit):  # neither or both of --model / --shape: refused before any work
        serving.main(["--rows", "plain", "--out", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit):
        serving.main(["--shape", "tiny", "--model", "m", "--profile", "p", "--out", str(tmp_path / "x.json")])

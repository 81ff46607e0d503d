"""The training-free profiler against a reference computed by hand from the model's eager attention
probabilities, on a tiny random model; its CLI; and profile v1/v2 round trips."""

import json

import pytest
import torch
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.cli.app import app
from duocal.demo import DEMO_MODEL_DIR
from duocal.models import load_model, load_tokenizer
from duocal.profiling import ProfilerConfig, attention_stats, profile_model
from duocal.profiling.attention_stats import AttentionStats, recording
from duocal.profiling.head_scores import selected_by_passes, snapkv_kept
from duocal.profiling.profiler import observation_mass, recorded_rows, sequences
from duocal_runtime.planning.head_order import bounded_order
from duocal_runtime.profile.measurements import Measurement

from helpers.models import tiny_model
from helpers.profiles import random_profile


def reference_measures(model, ids, rows, spans, policy_sizes, groups):
    """Eager attention probabilities [H, T, T] per layer, scored with plain loops."""
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = model(input_ids=torch.tensor([ids]), output_attentions=True).attentions
    model.set_attn_implementation("sdpa")
    sink, heavy, recent = policy_sizes
    out = {"retrieval": [], "kept": []}
    for probs in attentions:
        probs = probs[0].double()  # [H, T, T]
        rep = probs.shape[0] // groups
        column = probs.sum(1)  # [H, T]
        retrieval, kept = [], []
        for g in range(groups):
            heads = range(g * rep, (g + 1) * rep)
            retrieval.append(
                sum(float(probs[h, r, s:e].sum()) for h in heads for r, (s, e) in zip(rows, spans, strict=True))
                / (rep * len(rows))
            )
            group_column = sum(column[h] for h in heads)
            total = 0.0
            for r in rows:
                older = [k for k in range(r + 1) if not (k < sink or k > r - recent)]
                top = sorted(older, key=lambda k: -float(group_column[k]))[:heavy]
                keep = [k for k in range(r + 1) if k < sink or k > r - recent or k in top]
                total += sum(float(probs[h, r, keep].sum()) for h in heads) / rep
            kept.append(total / len(rows))
        out["retrieval"].append(retrieval)
        out["kept"].append(kept)
    return out


def test_profiler_scores_equal_a_dense_reference_by_hand(tiny_llama):
    model = tiny_llama
    tokenizer = load_tokenizer(DEMO_MODEL_DIR)
    model.resize_token_embeddings(max(97, len(tokenizer)), mean_resizing=False)
    config = ProfilerConfig(
        format="demo", haystack="synthetic", contexts=(160,), samples=2, num_passkeys=2, sink=3, recent=20
    )
    result = profile_model(model, tokenizer, config, "tiny")
    sink_h2o = config.policies()[2]
    want = {"retrieval": 0, "kept": 0}
    samples = list(sequences(tokenizer, config))
    for seq in samples:
        sizes = (sink_h2o.sink, sink_h2o.heavy, sink_h2o.recent)
        ref = reference_measures(model, seq.ids, seq.rows, seq.spans, sizes, 2)
        want = {k: want[k] + torch.tensor(ref[k], dtype=torch.float64) / len(samples) for k in want}
    got_retrieval = torch.tensor(result.measurements["retrieval"].scores, dtype=torch.float64)
    got_kept = torch.tensor(result.measurements["kept:sink_h2o"].scores, dtype=torch.float64)
    torch.testing.assert_close(got_retrieval, want["retrieval"], rtol=0, atol=1e-5)
    torch.testing.assert_close(got_kept, want["kept"], rtol=0, atol=1e-5)
    assert result.scores == result.measurements["retrieval"].scores
    assert result.measurements["kept:sink_h2o"].settings["policy"] == sink_h2o.to_dict()


@pytest.mark.parametrize("block_elements", [1, 6 * 37, 1 << 22])
def test_attention_stats_in_blocks_of_queries_equal_the_dense_softmax(monkeypatch, block_elements):
    """Blocks of one query, of a few, and one block for all: each block reads only the keys it can see."""
    monkeypatch.setattr(attention_stats, "BLOCK_ELEMENTS", block_elements)
    generator = torch.Generator().manual_seed(3)
    q, k = torch.randn(6, 37, 8, generator=generator), torch.randn(2, 37, 8, generator=generator)
    rows = [36, 0, 17]
    logits = q @ k.repeat_interleave(3, dim=0).transpose(-1, -2) * 0.3
    probs = logits.masked_fill(torch.ones(37, 37, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    stats = AttentionStats(rows).collect(q, k, 0.3)
    torch.testing.assert_close(stats.column_mass, probs.sum(1).view(2, 3, 37).sum(1))
    torch.testing.assert_close(stats.rows, probs[:, rows])


def test_profiler_finds_the_demo_models_retrieval_heads_deterministically():
    model, tokenizer = load_model(DEMO_MODEL_DIR), load_tokenizer(DEMO_MODEL_DIR)
    config = ProfilerConfig(format="demo", num_passkeys=(1, 6), contexts=(512,), samples=4, sink=16, recent=64)
    first, second = (profile_model(model, tokenizer, config) for _ in range(2))
    assert first.scores == second.scores
    top = bounded_order(first.flat_scores())[::-1][:3]
    assert {(h // 4, h % 4) for h in top} == {(1, 3), (1, 1), (1, 0)}
    assert first.source["kind"] == "profiler" and set(first.measurements) == {
        "retrieval",
        "kept:sink_window",
        "kept:h2o",
        "kept:sink_h2o",
        "kept:snapkv",
        "error:full-kv8",
        "error:full-kv4",
    }
    errors = {bits: first.measurements[f"error:full-kv{bits}"] for bits in (8, 4)}
    assert errors[4].settings["policy"] == dr.Full(kv_bits=4, group=16).to_dict()  # gcd(32, head_dim 16)
    mean = {bits: sum(m.flat()) / len(m.flat()) for bits, m in errors.items()}
    assert 0 < mean[8] < mean[4] < 0.5  # 4-bit codes move outputs more than 8-bit ones, neither moves them far


def snapkv_setup(protocol: str):
    model = tiny_model("llama")
    tokenizer = load_tokenizer(DEMO_MODEL_DIR)
    model.resize_token_embeddings(max(97, len(tokenizer)), mean_resizing=False)
    config = ProfilerConfig(
        format="demo", contexts=(160,), samples=1, num_passkeys=2, sink=3, recent=20, protocol=protocol
    )
    (seq,) = sequences(tokenizer, config)
    policy = config.policies()[-1]
    with recording(model, recorded_rows(seq, [policy])) as stats:
        model(input_ids=torch.tensor([seq.ids]), use_cache=False)
    position = {q: a for a, q in enumerate(recorded_rows(seq, [policy]))}
    rep = model.config.num_attention_heads // model.config.num_key_value_heads
    return model, seq, policy, observation_mass(policy, seq, stats.layers[0], position, rep)  # layer 0


def test_snapkv_kept_set_is_what_the_runtime_holds_after_the_prompt():
    model, seq, policy, mass = snapkv_setup("query-aware")
    assert isinstance(policy, dr.SnapKV) and seq.pass_ends == (seq.rows[0] + 1,)
    (end,), last = seq.pass_ends, seq.rows[-1]
    assert last > end  # the answer's later rows are decode steps
    held = selected_by_passes(policy, seq.pass_ends, mass)
    after = snapkv_kept(policy, last, held, end)  # decode: the selection stays, the window slides
    with dr.apply(model, dr.uniform_plan(dr.shape_of_config(model.config), policy)) as runtime:
        cache = runtime.new_cache()
        model(input_ids=torch.tensor([seq.ids[:end]]), cache=cache)
        prefilled = cache.layers[0].groups[0].rank[0].clone()  # layer 0 sees the same inputs with or without the plan
        for token in seq.ids[end : last + 1]:
            model(input_ids=torch.tensor([[token]]), cache=cache)
    decoded = cache.layers[0].groups[0].rank[0]
    for g in range(2):
        assert set(prefilled[g][prefilled[g] >= 0].tolist()) == set(held[g].nonzero().flatten().tolist())
        assert set(decoded[g][decoded[g] >= 0].tolist()) == set(after[g].nonzero().flatten().tolist())
    assert int(held.sum(-1).max()) == int(after.sum(-1).max()) == policy.selected + policy.window


def test_snapkv_after_the_context_selects_again_among_what_it_still_holds():
    _model, seq, policy, mass = snapkv_setup("query-agnostic")
    context_end, prompt_end = seq.pass_ends
    assert context_end < prompt_end == seq.rows[0] + 1
    first = selected_by_passes(policy, seq.pass_ends[:1], mass)
    second = selected_by_passes(policy, seq.pass_ends, mass)
    keys = torch.arange(second.shape[-1])
    question = (keys >= context_end) & (keys < prompt_end)
    assert not (second & ~(first | question)).any()  # nothing evicted comes back
    assert int(second.sum(-1).max()) == policy.selected + policy.window


def test_cli_profile_writes_a_profile_with_measurements_and_refuses_bad_input(tmp_path):
    runner = CliRunner()
    out = tmp_path / "p.json"
    result = runner.invoke(app, ["profile", "--samples", "2", "--contexts", "256", "--output", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["version"] == 3 and data["source"]["kind"] == "profiler" and "kept:h2o" in data["measurements"]
    # progress on stderr (plain lines off a terminal): the first sequence, with an ETA, and the last
    assert "profile: 1/2 (50%), " in result.stderr and ", ETA " in result.stderr, result.stderr
    assert "profile: 2/2 (100%), " in result.stderr
    text = tmp_path / "t.txt"
    text.write_text("abc def ghi " * 200)
    result = runner.invoke(
        app,
        [
            "profile",
            "--data",
            "text",
            "--text",
            str(text),
            "--contexts",
            "256",
            "--samples",
            "1",
            "--output",
            str(tmp_path / "t.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "retrieval" not in json.loads((tmp_path / "t.json").read_text())["measurements"]
    bad_inputs = (["--method", "gradient"], ["--data", "text"], ["--contexts", "0"], ["--protocol", "sideways"])
    for args in (*bad_inputs, ["--data", "text", "--text", str(text), "--protocol", "query-agnostic"]):
        bad = runner.invoke(app, ["profile", *args, "--output", str(tmp_path / "x.json")])
        assert bad.exit_code == 1 and bad.output.startswith("error:"), (args, bad.output)
    assert not (tmp_path / "x.json").exists()


def test_cli_profile_scores_from_keeps_the_gates_and_measures_at_the_profiles_sink_window(tmp_path):
    base = dr.load_profile("demo-model")
    moved = tmp_path / "base.json"  # a deploy sink window unlike the demo model's usual 16 + 64
    dr.save_profile(base.with_deploy(dr.SinkWindow(8, 32)), moved)
    out = tmp_path / "merged.json"
    result = CliRunner().invoke(
        app, ["profile", "--samples", "2", "--contexts", "256", "--scores-from", str(moved), "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    merged = dr.load_profile(str(out))
    assert merged.scores == base.scores and merged.source["kind"] == base.source["kind"]
    assert merged.source["measured_by"]["kind"] == "profiler"
    assert merged.deploy.sink_window == dr.SinkWindow(8, 32)
    measured = merged.measurements["kept:sink_window"].settings["policy"]
    assert (measured["sink"], measured["recent"]) == (8, 32)


def test_v1_files_load_with_their_flat_sizes_and_save_as_v3(tmp_path):
    old = random_profile().to_dict()
    old.update(
        version=1, deploy={"sparsity": 0.25, "policy": "h2o", "sink": 8, "recent": 40, "heavy": 12, "h2o_recent": 20}
    )
    v1 = tmp_path / "v1.json"
    v1.write_text(json.dumps(old))
    loaded = dr.load_profile(str(v1))
    d = loaded.deploy
    assert (d.sparsity, d.policy) == (0.25, "h2o")
    assert (
        d.sink_window == dr.SinkWindow(8, 40)
        and d.sized("h2o") == dr.H2O(12, 20)
        and d.sized("sink_h2o") == dr.SinkH2O(8, 12, 20)
    )
    assert dr.plan(loaded).policies == dr.plan(loaded, policy="h2o", heavy=12, recent=20).policies
    again = dr.save_profile(loaded, tmp_path / "again.json")
    assert json.loads(again.read_text())["version"] == 3
    assert dr.load_profile(str(again)) == loaded
    shipped = dr.load_profile("demo-model")
    assert shipped.measurements == {}
    measured = dr.Profile(
        shipped.model,
        shipped.scores,
        shipped.source,
        shipped.deploy,
        {"kept:sink_window": Measurement(shipped.scores, {"policy": {"policy": "sink_window"}})},
    )
    path = dr.save_profile(measured, tmp_path / "v3.json")
    assert json.loads(path.read_text())["version"] == 3
    assert dr.load_profile(str(path)) == measured
    with pytest.raises(dr.ProfileError, match=r"measurements.kept:sink_window.scores \[0\]\[1\]"):
        bad = json.loads(path.read_text())
        bad["measurements"]["kept:sink_window"]["scores"][0][1] = 1.5
        dr.profile_from_dict(bad)


def test_rank_correlation_and_compare_cli(tmp_path):
    from duocal.reports.profile_compare import spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0 and spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert spearman([1, 1, 2, 3], [1, 2, 2, 3]) == pytest.approx(0.8333, abs=1e-4)  # ties share mean ranks
    shipped = dr.load_profile("demo-model")
    flipped = dr.save_profile(
        dr.Profile(shipped.model, [[1 - s for s in row] for row in shipped.scores]), tmp_path / "flipped.json"
    )
    out = CliRunner().invoke(app, ["profiles", "compare", "demo-model", str(flipped), "--top", "3", "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.output)
    assert result["spearman"] < -0.9 and result["top_overlap"] == 0 and result["heads"] == 16


def test_a_mix_with_snapkv_is_planned_by_its_measured_kept_share_in_each_protocol():
    from duocal.eval.row_kinds import check_mix_policies, mix_plan

    model, tokenizer = load_model(DEMO_MODEL_DIR), load_tokenizer(DEMO_MODEL_DIR)
    measured = {}
    for protocol in ("query-aware", "query-agnostic"):
        config = ProfilerConfig(format="demo", contexts=(512,), samples=4, sink=16, recent=64, protocol=protocol)
        measured[protocol] = profile_model(model, tokenizer, config)
        kept = measured[protocol].measurements["kept:snapkv"]
        assert kept.settings["protocol"] == protocol and kept.settings["policy"]["window"] == 20
    aware, agnostic = (torch.tensor(measured[p].measurements["kept:snapkv"].scores) for p in measured)
    assert aware.mean() > agnostic.mean()  # selecting before the question keeps less of what the answer reads
    for profile in measured.values():
        plan = mix_plan(profile, tokens=16 * 300, context=512, policies=("full", "sink_window", "snapkv"))
        counts = plan.choice["policy_counts"]
        assert set(counts) == {"full", "sink_window", "snapkv"} and sum(counts.values()) == 16
        assert plan.kv_tokens(512) <= 16 * 300
    for bad in (("sink_window", "h2o"), ("full",), ("full", "turbo"), ("full", "h2o", "h2o")):
        with pytest.raises(ValueError, match="mix policies"):
            check_mix_policies(bad)

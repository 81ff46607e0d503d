"""Hostile command lines for `duocal serve MODEL --engine vllm`: each is one `error:` line naming what is wrong,
exit code 1, no traceback, in well under a second or two, and vLLM never starts (the real CLI, with the step that
becomes vLLM's server made to fail the test). No engine here; the running server's cases are in
test_serve_hostile_requests.py."""

import json
import math
import os
import socket
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from duocal.cli.app import app
from duocal.serving import vllm_launch

from helpers.vllm_engines import PROFILE, profile_of_another_model

NAME = "smollm2-135m-instruct"
SHIPPED = json.loads(PROFILE.read_text())


def edited_profile(folder: Path, edit) -> str:
    """The shipped profile, changed by `edit(data)` (which may return new text instead)."""
    data = json.loads(json.dumps(SHIPPED))
    text = edit(data)
    path = folder / "edited.json"
    path.write_text(text if isinstance(text, str) else json.dumps(data))
    return str(path)


def model_with_config(folder: Path, model_folder: Path, edit, weights: bool = True) -> str:
    """A model folder whose config.json is SmolLM2's changed by `edit(config)` (or the text it returns), with
    SmolLM2's weights unless `weights` is False."""
    folder.mkdir()
    config = json.loads((model_folder / "config.json").read_text())
    text = edit(config)
    (folder / "config.json").write_text(text if isinstance(text, str) else json.dumps(config))
    for found in model_folder.glob("*.safetensors") if weights else ():
        (folder / found.name).symlink_to(found)
    return str(folder)


def set_deploy(**values):
    return lambda data: data["deploy"].update(values)


def set_sizes(sink, recent):
    return lambda data: data["deploy"]["sizes"].update(sink_window={"sink": sink, "recent": recent})


def drop(key):
    return lambda config: config.pop(key)


# name -> (arguments after `duocal serve`, words the error line holds); a callable builds them in tmp_path
CASES = {
    # profiles: missing, damaged, of another model, not a file
    "profile missing": (lambda t, m: [NAME, "--profile", str(t / "none.json")], "none.json"),
    "profile empty": (lambda t, m: [NAME, "--profile", edited_profile(t, lambda d: "")], "edited.json"),
    "profile truncated": (
        lambda t, m: [NAME, "--profile", edited_profile(t, lambda d: PROFILE.read_text()[:2000])],
        "edited.json",
    ),
    "profile binary": (lambda t, m: [NAME, "--profile", edited_profile(t, lambda d: "\x00\xff\x13" * 50)], "edited"),
    "profile a JSON list": (lambda t, m: [NAME, "--profile", edited_profile(t, lambda d: "[1, 2]")], "edited.json"),
    "profile of another format": (lambda t, m: [NAME, "--profile", edited_profile(t, set_format("other"))], "format"),
    "profile of a future version": (lambda t, m: [NAME, "--profile", edited_profile(t, set_version(99))], "version"),
    "profile with a NaN score": (lambda t, m: [NAME, "--profile", edited_profile(t, set_score(math.nan))], "score"),
    "profile with a score of 7": (lambda t, m: [NAME, "--profile", edited_profile(t, set_score(7.0))], "score"),
    "profile with a string score": (lambda t, m: [NAME, "--profile", edited_profile(t, set_score("high"))], "score"),
    "profile with a short layer": (lambda t, m: [NAME, "--profile", edited_profile(t, short_layer)], "scores"),
    "profile without scores": (lambda t, m: [NAME, "--profile", edited_profile(t, drop("scores"))], "scores"),
    "profile with a key twice": (
        lambda t, m: [NAME, "--profile", edited_profile(t, lambda d: '{"format": 1, "format": 2}')],
        "twice",
    ),
    "profile of another model": (lambda t, m: [NAME, "--profile", str(profile_of_another_model(t))], "28 layers"),
    "profile with a wrong fingerprint": (
        lambda t, m: [NAME, "--profile", edited_profile(t, lambda d: d["model"].update(fingerprint="sha256:0"))],
        "fingerprint",
    ),
    "profile deploying h2o": (lambda t, m: [NAME, "--profile", edited_profile(t, set_deploy(policy="h2o"))], "H2O"),
    "profile with sink 0 and recent 0": (
        lambda t, m: [NAME, "--profile", edited_profile(t, set_sizes(0, 0))],
        "sink must",
    ),
    "profile with a negative window": (lambda t, m: [NAME, "--profile", edited_profile(t, set_sizes(64, -5))], "rec"),
    "profile a folder": (lambda t, m: [NAME, "--profile", str(t)], "neither profile.json"),
    "profile a fifo": (lambda t, m: [NAME, "--profile", fifo(t)], "fifo"),
    "profile a device": (lambda t, m: [NAME, "--profile", "/dev/null"], "/dev/null"),
    "profile an unknown name": (lambda t, m: [NAME, "--profile", "no-such-profile"], "no-such-profile"),
    # sparsity and budget
    "sparsity below 0": (lambda t, m: [NAME, "--sparsity", "-0.1"], "sparsity"),
    "sparsity above 1": (lambda t, m: [NAME, "--sparsity", "1.5"], "sparsity"),
    "sparsity NaN": (lambda t, m: [NAME, "--sparsity", "nan"], "sparsity"),
    "sparsity inf": (lambda t, m: [NAME, "--sparsity", "inf"], "sparsity"),
    "sparsity with a budget": (lambda t, m: [NAME, "--sparsity", "0.5", "--budget", "100MiB"], "not both"),
    "budget 0": (lambda t, m: [NAME, "--budget", "0"], "error: cannot read budget"),
    "budget negative": (lambda t, m: [NAME, "--budget", "-1GiB"], "budget"),
    "budget unreadable": (lambda t, m: [NAME, "--budget", "lots"], "budget"),
    "budget NaN": (lambda t, m: [NAME, "--budget", "nanGiB"], "budget"),
    "budget too small": (lambda t, m: [NAME, "--budget", "1MiB"], "impossible budget"),
    "budget under tensor parallel": (lambda t, m: [NAME, "--budget", "100MiB", "--", "-tp", "2"], "not a budget"),
    # --kv-memory forms
    "kv-memory a fraction of a GiB": (lambda t, m: [NAME, "--kv-memory", "1.5GiB"], "whole GiB"),
    "kv-memory in MiB": (lambda t, m: [NAME, "--kv-memory", "512MiB"], "whole GiB"),
    "kv-memory decimal GB": (lambda t, m: [NAME, "--kv-memory", "2GB"], "whole GiB"),
    "kv-memory 0": (lambda t, m: [NAME, "--kv-memory", "0GiB"], "whole GiB"),
    "kv-memory negative": (lambda t, m: [NAME, "--kv-memory", "-1GiB"], "whole GiB"),
    "kv-memory tokens": (lambda t, m: [NAME, "--kv-memory", "20000 tokens"], "whole GiB"),
    "kv-memory a bare number": (lambda t, m: [NAME, "--kv-memory", "1"], "whole GiB"),
    "kv-memory empty": (lambda t, m: [NAME, "--kv-memory", ""], "whole GiB"),
    "kv-memory unreadable": (lambda t, m: [NAME, "--kv-memory", "lots"], "whole GiB"),
    "kv-memory inf": (lambda t, m: [NAME, "--kv-memory", "infGiB"], "whole GiB"),
    "kv-memory beyond this machine": (lambda t, m: [NAME, "--kv-memory", "100000GiB"], "machine's memory"),
    "kv-memory with vLLM's own KV bytes": (
        lambda t, m: [NAME, "--kv-memory", "1GiB", "--", "--kv-cache-memory-bytes", "1000000000"],
        "--kv-cache-memory-bytes",
    ),
    # options duocal sets itself, given again after `--`
    "--model after --": (lambda t, m: [NAME, "--", "--model", "other"], "--model"),
    "--model= after --": (lambda t, m: [NAME, "--", "--model=other"], "--model"),
    "--served-model-name after --": (lambda t, m: [NAME, "--", "--served-model-name", "x"], "--served-model-name"),
    "--served_model_name after --": (lambda t, m: [NAME, "--", "--served_model_name", "x"], "--served-model-name"),
    "--hf-overrides after --": (lambda t, m: [NAME, "--", "--hf-overrides", "{}"], "--hf-overrides"),
    "--hf_overrides= after --": (lambda t, m: [NAME, "--", "--hf_overrides={}"], "--hf-overrides"),
    "--hf-overrides.KEY after --": (lambda t, m: [NAME, "--", "--hf-overrides.duocal_sparsity", "0"], "--hf-overrides"),
    "an abbreviation of --served-model-name": (lambda t, m: [NAME, "--", "--served-model", "x"], "--served-model-name"),
    "an abbreviation of --port": (lambda t, m: [NAME, "--", "--por=1"], "--port"),
    "a --config file setting the port": (lambda t, m: [NAME, "--", "--config", yaml_file(t, "port: 1\n")], "port"),
    "a --config file setting the model": (lambda t, m: [NAME, "--", "--config", yaml_file(t, "model: x\n")], "model"),
    "a --config file setting a Unix socket": (
        lambda t, m: [NAME, "--", "--config", yaml_file(t, "uds: /tmp/duocal.sock\n")],
        "uds",
    ),
    "a --config file as --config=PATH (vLLM ignores it)": (
        lambda t, m: [NAME, "--", "--config=" + yaml_file(t, "max-model-len: 1024\n")],
        "--config PATH",
    ),
    "a --config file's KV bytes beside --kv-memory": (
        lambda t, m: [NAME, "--kv-memory", "2GiB", "--", "--config", yaml_file(t, "kv_cache_memory_bytes: 4G\n")],
        "not both",
    ),
    "a --config file's pipeline parallel 2": (
        lambda t, m: [NAME, "--", "--config", yaml_file(t, "pipeline_parallel_size: 2\n")],
        "pipeline",
    ),
    "a --config file that is not YAML": (lambda t, m: [NAME, "--", "--config", yaml_file(t, "a: [\n")], "YAML"),
    "a --config file that is missing": (lambda t, m: [NAME, "--", "--config", str(t / "none.yaml")], "none.yaml"),
    "--host after --": (lambda t, m: [NAME, "--", "--host", "0.0.0.0"], "--host"),
    "--port= after --": (lambda t, m: [NAME, "--", "--port=1"], "--port"),
    "--uds after -- (vLLM would ignore --host / --port)": (lambda t, m: [NAME, "--", "--uds", "/tmp/s"], "--uds"),
    "--hf_config_path after --": (lambda t, m: [NAME, "--", "--hf_config_path", str(t)], "--hf-config-path"),
    "--max-model-len unreadable": (lambda t, m: [NAME, "--", "--max-model-len", "lots"], "--max-model-len"),
    "--max-model-len a fraction of a binary K": (lambda t, m: [NAME, "--", "--max-model-len", "1.5K"], "max-model"),
    "an ambiguous abbreviation (vLLM's parser)": (lambda t, m: [NAME, "--", "--po", "9"], "ambiguous option"),
    "an option vLLM does not have": (lambda t, m: [NAME, "--", "--no-such-option", "1"], "unrecognized arguments"),
    "--port at vLLM's default after --": (lambda t, m: [NAME, "--port", "9", "--", "--port", "8000"], "--port"),
    "--engine transformers options": (lambda t, m: [NAME, "--num-blocks", "10"], "--num-blocks"),
    "no model": (lambda t, m: ["--", "--max-model-len", "128"], "needs MODEL"),
    "a bare word first after --": (lambda t, m: [NAME, "--", "extra", "--max-num-seqs", "2"], "not an option"),
    # tensor parallelism
    "tensor parallel 2 over 3 KV heads": (lambda t, m: [NAME, "--", "--tensor-parallel-size", "2"], "tensor parallel"),
    "tensor parallel 4 over 3 KV heads": (lambda t, m: [NAME, "--", "-tp=4"], "tensor parallel"),
    "tensor parallel 0": (lambda t, m: [NAME, "--", "-tp", "0"], "tensor-parallel-size"),
    "tensor parallel negative": (lambda t, m: [NAME, "--", "--tensor-parallel-size=-2"], "tensor-parallel-size"),
    "tensor parallel not a number": (lambda t, m: [NAME, "--", "-tp", "two"], "tensor-parallel-size"),
    "tensor parallel without a value": (lambda t, m: [NAME, "--", "--tensor-parallel-size"], "tensor-parallel-size"),
    "pipeline parallel": (lambda t, m: [NAME, "--", "--pipeline-parallel-size", "2"], "pipeline"),
    "pipeline parallel 1 then 2 (the last wins)": (
        lambda t, m: [NAME, "--", "--pipeline-parallel-size", "1", "-pp", "2"],
        "pipeline",
    ),
    "pipeline parallel not a number": (lambda t, m: [NAME, "--", "-pp", "two"], "pipeline-parallel-size"),
    # model folders
    "model folder without architectures": (
        lambda t, m: [model_with_config(t / "m", m, drop("architectures")), "--profile", str(PROFILE)],
        "without architectures",
    ),
    "architectures a string": (
        lambda t, m: [
            model_with_config(t / "m", m, lambda c: c.update(architectures="LlamaForCausalLM")),
            "--profile",
            str(PROFILE),
        ],
        "architectures must be a list",
    ),
    "config.json broken": (
        lambda t, m: [model_with_config(t / "m", m, lambda c: "{"), "--profile", str(PROFILE)],
        "config.json",
    ),
    "config.json a list": (
        lambda t, m: [model_with_config(t / "m", m, lambda c: "[]"), "--profile", str(PROFILE)],
        "config.json",
    ),
    "config without head counts": (
        lambda t, m: [model_with_config(t / "m", m, drop("num_attention_heads")), "--profile", str(PROFILE)],
        "num_attention_heads",
    ),
    "config with 0 heads": (
        lambda t, m: [
            model_with_config(t / "m", m, lambda c: c.update(num_attention_heads=0)),
            "--profile",
            str(PROFILE),
        ],
        "num_attention_heads",
    ),
    "model folder missing": (lambda t, m: [str(t / "nothing"), "--profile", str(PROFILE)], "does not exist"),
    "model folder without config": (lambda t, m: [empty_folder(t), "--profile", str(PROFILE)], "config.json"),
    "model a text file": (lambda t, m: [str(PROFILE), "--profile", str(PROFILE)], "not a .gguf"),
    "unknown model name": (lambda t, m: ["no-such-model"], "no-such-model"),
    "a Hub id": (lambda t, m: ["someone/some-model"], "model folder"),
    "model without a shipped profile": (lambda t, m: [model_with_config(t / "m", m, lambda c: None)], "--profile"),
    "model folder with a config and no weights": (
        lambda t, m: [model_with_config(t / "m", m, lambda c: None, weights=False), "--profile", str(PROFILE)],
        "no weights",
    ),
    # where vLLM is to listen: refused here, not by vLLM's server after its start-up
    "port above 65535": (lambda t, m: [NAME, "--port", "70000"], "--port must be 0-65535"),
    "port negative": (lambda t, m: [NAME, "--port", "-1"], "--port must be 0-65535"),
    "host not an address or a known name": (lambda t, m: [NAME, "--host", "garbage"], "cannot listen on garbage"),
    "port in use": (lambda t, m: [NAME, "--port", str(port_in_use())], "cannot listen on 127.0.0.1"),
}


LISTENERS = []  # sockets held open for the rest of the module: the ports they hold are in use


def port_in_use() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    LISTENERS.append(sock)
    return sock.getsockname()[1]


def set_format(value):
    return lambda data: data.update(format=value)


def set_version(value):
    return lambda data: data.update(version=value)


def set_score(value):
    return lambda data: data["scores"][3].__setitem__(1, value)


def short_layer(data):
    data["scores"][5] = data["scores"][5][:2]


def yaml_file(folder: Path, text: str) -> str:
    path = folder / "vllm.yaml"
    path.write_text(text)
    return str(path)


def fifo(folder: Path) -> str:
    path = folder / "profile.fifo"
    os.mkfifo(path)
    return str(path)


def empty_folder(folder: Path) -> str:
    (folder / "empty").mkdir()
    return str(folder / "empty")


@pytest.fixture(scope="module")
def imported(model_folder):
    """The first plan imports duocal's runtime: done once here, so that each case's time is its own."""
    vllm_launch.vllm_launch(vllm_launch.VllmServe(NAME))


@pytest.fixture
def no_server_start(monkeypatch, imported):
    """Fails the test if the command goes on to become vLLM's server."""

    def started(launch):
        raise AssertionError(f"vLLM was started: {launch.argv}")

    monkeypatch.setattr(vllm_launch, "exec_server", started)


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_command_line_is_one_error_line_before_vllm_starts(case, tmp_path, model_folder, no_server_start):
    build, words = CASES[case]
    args = ["serve", "--engine", "vllm", *build(tmp_path, model_folder)]
    start = time.monotonic()
    result = CliRunner().invoke(app, args)
    seconds = time.monotonic() - start
    lines = (result.stderr or result.output).strip().splitlines()
    assert result.exit_code == 1, (result.output, result.exception)
    assert lines and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    assert words in lines[0], lines[0]
    assert seconds < 3  # a fifo or a slow check would show here


# edge values that are served: (arguments, what the launch carries)
ACCEPTED = {
    "sparsity 1 (every head streaming)": ([NAME, "--sparsity", "1"], {"duocal_sparsity": 1.0}),
    "sparsity 0 (every head full)": ([NAME, "--sparsity", "0"], {"duocal_sparsity": 0.0}),
    "a budget above the plain model's KV": ([NAME, "--budget", "1TiB"], {"duocal_budget": "1TiB"}),
    "kv-memory 1024MiB": ([NAME, "--kv-memory", "1024MiB"], {"VLLM_CPU_KVCACHE_SPACE": "1"}),
    "kv-memory with a space": ([NAME, "--kv-memory", "2 GiB"], {"VLLM_CPU_KVCACHE_SPACE": "2"}),
    "vLLM's own KV bytes alone": ([NAME, "--", "--kv-cache-memory-bytes", "500000000"], {}),
    "a --config file of other options": ([NAME, "--", "--config", "CONFIG"], {}),
    "pipeline parallel 01": ([NAME, "--", "-pp", "01"], {}),
    "pipeline parallel 2 then 1 (the last wins)": ([NAME, "--", "-pp", "2", "--pipeline_parallel_size=1"], {}),
}


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_an_edge_value_that_is_served_reaches_vllm_as_given(case, tmp_path, no_server_start, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    args, carried = ACCEPTED[case]
    args = [yaml_file(tmp_path, "max-model-len: 1024\n") if arg == "CONFIG" else arg for arg in args]
    options = {"--sparsity": ("sparsity", float), "--budget": ("budget", str), "--kv-memory": ("kv_memory", str)}
    settings = {options[args[1]][0]: options[args[1]][1](args[2])} if args[1] in options else {}
    vllm_args = tuple(args[args.index("--") + 1 :]) if "--" in args else ()
    launch = vllm_launch.vllm_launch(vllm_launch.VllmServe(NAME, vllm_args=vllm_args, **settings))
    overrides = json.loads(launch.argv[launch.argv.index("--hf-overrides") + 1])
    assert {**overrides, **launch.env} | carried == {**overrides, **launch.env}
    assert launch.argv[len(launch.argv) - len(vllm_args) :] == list(vllm_args)


def test_port_0_becomes_a_free_port_that_vllm_is_given_and_duocal_names(no_server_start):
    launch = vllm_launch.vllm_launch(vllm_launch.VllmServe(NAME, port=0))
    port = int(launch.argv[launch.argv.index("--port") + 1])
    assert 0 < port <= 65535 and f"http://127.0.0.1:{port}/v1" in launch.summary
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # released for vLLM to bind


def test_the_load_format_dummy_needs_no_weights(tmp_path, model_folder, no_server_start):
    folder = model_with_config(tmp_path / "m", model_folder, lambda c: None, weights=False)
    launch = vllm_launch.vllm_launch(vllm_launch.VllmServe(folder, str(PROFILE), vllm_args=("--load-format", "dummy")))
    assert launch.argv[-2:] == ["--load-format", "dummy"]


def test_the_probe_has_at_least_sixty_command_lines():
    assert len(CASES) + len(ACCEPTED) + 1 >= 60


def test_vllms_own_kv_bytes_beside_the_kv_space_variable_is_refused(monkeypatch, no_server_start):
    """vLLM-CPU takes VLLM_CPU_KVCACHE_SPACE over `--kv-cache-memory-bytes` without a word."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    result = CliRunner().invoke(app, ["serve", "--engine", "vllm", NAME, "--", "--kv-cache-memory-bytes", "500000000"])
    assert result.exit_code == 1
    assert (result.stderr or result.output).startswith("error: VLLM_CPU_KVCACHE_SPACE is set in this environment")


def launch_argv(vllm_args: tuple[str, ...], model: str = NAME, **settings) -> list[str]:
    """The server's arguments that duocal puts before the user's own (`vllm_args`)."""
    argv = vllm_launch.vllm_launch(vllm_launch.VllmServe(model, vllm_args=vllm_args, **settings)).argv
    assert argv[len(argv) - len(vllm_args) :] == list(vllm_args)
    return argv[: len(argv) - len(vllm_args)]


def test_a_config_files_block_size_and_chunk_cap_are_the_users(tmp_path, no_server_start):
    """vLLM puts a --config file's options before the command line, so duocal's own would overrule the file's."""
    assert {"--block-size", vllm_launch.CHUNK_CAP_OPTION} <= set(launch_argv(()))  # what the plan adds by default
    config = yaml_file(tmp_path, "block_size: 16\nlong_prefill_token_threshold: 32\n")
    ours = launch_argv(("--config", config))
    assert "--block-size" not in ours and vllm_launch.CHUNK_CAP_OPTION not in ours


@pytest.mark.parametrize("length, cap", [("0.1k", 100), ("1K", 1024), ("96", 96), ("auto", None), ("-1", None)])
def test_the_chunk_cap_reads_max_model_len_as_vllm_does(length, cap, no_server_start):
    """vLLM reads --max-model-len with k (1000) and K (1024) suffixes, and auto / -1 as the model's own."""
    recent = chunk_cap(launch_argv(()))
    assert recent > 100  # else the suffixes would not show
    assert chunk_cap(launch_argv(("--max-model-len", length))) == (recent if cap is None else min(recent, cap))


def chunk_cap(argv: list[str]) -> int:
    return int(argv[argv.index(vllm_launch.CHUNK_CAP_OPTION) + 1])


def test_a_config_json_naming_its_model_is_served(tmp_path, model_folder, no_server_start):
    """Most Hub models' config.json holds _name_or_path; the model folder's path is the one the plan uses."""
    folder = model_with_config(tmp_path / "m", model_folder, lambda c: c.update(_name_or_path="someone/model"))
    assert launch_argv((), model=folder, profile=str(PROFILE))[:1]

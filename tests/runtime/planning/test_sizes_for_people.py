"""Sizes in CLI output and error messages read as MiB / GiB (the exact count may follow in
parentheses), never as a bare '107642880 bytes' (issue 38)."""

import re
import socket
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.cli.app import app
from duocal.serving.request_checks import too_large
from duocal_runtime.planning.sizes import bytes_with_count, human_bytes

from helpers.profiles import random_profile

READABLE_WITH_COUNT = re.compile(r"\d+\.\d+ (KiB|MiB|GiB) \(\d{1,3}(,\d{3})* bytes\)")
BARE_BYTES = re.compile(r"(?<![\d,(])\d{4,}(,\d{3})* (bytes|B)\b")


def test_a_count_reads_in_the_largest_unit_with_the_exact_count_after_it():
    assert bytes_with_count(107_642_880) == "102.7 MiB (107,642,880 bytes)"
    assert bytes_with_count(3 * 1024**3) == "3.00 GiB (3,221,225,472 bytes)"
    assert bytes_with_count(512) == "512 B"
    assert human_bytes(1536) == "1.5 KiB"


def test_a_plan_summary_says_its_kv_cache_in_mib():
    profile = random_profile(layers=30, kv_heads=3, heads=9, head_dim=64)
    text = dr.plan(profile, sparsity=0.5).summary(context=32768)
    assert READABLE_WITH_COUNT.search(text), text
    assert not BARE_BYTES.search(text), text


def test_an_impossible_budget_says_both_sizes_readably():
    profile = random_profile(layers=4, kv_heads=4, heads=4, head_dim=8)
    with pytest.raises(dr.PlanError) as err:
        dr.plan(profile, budget="3KiB", context=100_000)
    message = str(err.value)
    assert "impossible budget: 3.0 KiB (3,072 bytes)" in message, message
    assert len(READABLE_WITH_COUNT.findall(message)) == 2 and not BARE_BYTES.search(message), message


def test_a_request_over_the_size_limit_is_told_the_limit_in_mib():
    assert "over 4.0 MiB (4,194,304 bytes) (the server's --max-request-size)" in too_large(4 * 1024**2).message


def test_serve_prints_its_pool_in_gib_and_mib(monkeypatch):
    import duocal.serving.addresses as addresses
    import duocal.serving.startup as startup

    summary = {
        "kv_bytes": 2 * 1024**3,
        "requests": 12,
        "context": 8192,
        "bytes_per_request": 107_642_880,
        "plain_requests": 3,
        "plain_bytes_per_request": 402_653_184,
    }
    plan = SimpleNamespace(num_bounded=45, num_heads=90)
    served = SimpleNamespace(name="m", runtime=SimpleNamespace(plan=plan))
    monkeypatch.setattr(addresses, "listening_socket", lambda host, port: socket.socket())
    monkeypatch.setattr(startup, "prepare_server", lambda settings: (served, summary))
    monkeypatch.setattr(startup, "run", lambda served, sock: False)
    result = CliRunner().invoke(app, ["serve", "m", "--port", "0"])
    assert result.exit_code == 0, result.output
    assert "KV pool: 2.00 GiB (2,147,483,648 bytes); 12 requests of 8192 tokens" in result.output, result.output
    assert "(102.7 MiB each) vs 3 with plain attention (384.0 MiB each)" in result.output, result.output
    assert not BARE_BYTES.search(result.output), result.output

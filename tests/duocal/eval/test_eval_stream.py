"""`duocal eval stream` on a tiny random Llama (the demo tokenizer: one token per character, so a text of N
characters is N tokens): buckets, KV bytes, the rows that stop, fresh checks, JSON, the plot, and bad input
refused before the weights load, never with a traceback."""

import json
import os
import threading

import pytest
from typer.testing import CliRunner

from duocal.cli.app import app
from duocal.models import resolve

TEXT = "the quick brown fox jumps over the lazy dog and keeps on running. " * 200  # 13,400 tokens


def stream(model, *args, text=None, tmp=None):
    if text is not None and tmp is not None:
        (tmp / "text.txt").write_text(text)
        args = ("--text", str(tmp / "text.txt"), *args)
    return CliRunner().invoke(app, ["eval", "stream", "--model", str(model), *args])


def test_rows_stream_in_buckets_and_only_bounded_rows_hold_their_memory(tiny_llama_folder, tmp_path):
    out = tmp_path / "stream.json"
    result = stream(
        tiny_llama_folder, "--tokens", "4096", "--bucket", "1024", "--chunk", "256", "--sink", "4", "--recent", "60",
        "--rows", "full,streaming-original,streaming", "--fresh-checks", "2",
        "--json", str(out), "--plot", str(tmp_path / "stream.png"), text=TEXT, tmp=tmp_path,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["trained_length"] == 1024
    rows = {row["name"]: row for row in data["rows"]}
    assert list(rows) == ["full", "streaming-original", "streaming"]
    for row in rows.values():
        assert [(b["start"], b["end"]) for b in row["buckets"]] == [(0, 1024), (1024, 2048), (2048, 3072), (3072, 4096)]
        assert all(b["ppl"] > 1 and b["tokens_per_s"] > 0 and b["rss_bytes"] > 0 for b in row["buckets"])
        assert row["stopped"] is None
    full_kv = [b["kv_bytes"] for b in rows["full"]["buckets"]]
    assert full_kv == sorted(full_kv) and full_kv[-1] >= 3.9 * full_kv[0]
    for name in ("streaming", "streaming-original"):
        assert len({b["kv_bytes"] for b in rows[name]["buckets"]}) == 1  # full after the first 64 tokens
    fresh = [b["fresh_ppl"] for b in rows["streaming"]["buckets"]]
    assert fresh[0] is None and fresh[1] is not None and fresh[3] is not None and fresh[2] is None
    assert all(b["fresh_ppl"] is None for b in rows["full"]["buckets"])
    assert [end for end, _ in rows["streaming"]["points"]] == list(range(256, 4097, 256))  # one per chunk
    assert (tmp_path / "stream.png").read_bytes()[:4] == b"\x89PNG"
    assert "streaming-original" in result.output and "4,096" in result.output


def test_rows_with_full_heads_stop_at_their_kv_limit_saying_so(tiny_llama_folder, tmp_path):
    result = stream(
        tiny_llama_folder, "--tokens", "4096", "--bucket", "1024", "--chunk", "256", "--rows", "full,streaming",
        "--full-kv-limit", "300KiB", "--json", "-", text=TEXT, tmp=tmp_path,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)["rows"]}
    assert "its KV cache would pass --full-kv-limit" in rows["full"]["stopped"]
    assert len(rows["full"]["buckets"]) < 4 and len(rows["streaming"]["buckets"]) == 4
    result = stream(
        tiny_llama_folder, "--tokens", "4096", "--bucket", "1024", "--chunk", "256", "--rows", "full,streaming",
        "--time-limit", "1e-9", "--json", "-", text=TEXT, tmp=tmp_path,
    )  # fmt: skip
    rows = {row["name"]: row for row in json.loads(result.stdout)["rows"]}
    assert rows["full"]["stopped"] == "stopped at 256 tokens: it ran past --time-limit (1e-09 s)"
    assert len(rows["streaming"]["buckets"]) == 4  # bounded rows run to the end


def test_a_fifo_that_never_ends_streams_until_tokens(tiny_llama_folder, tmp_path):
    fifo = tmp_path / "endless"
    os.mkfifo(fifo)
    stop = threading.Event()

    def write_forever():
        try:
            with open(fifo, "w") as handle:
                while not stop.is_set():
                    handle.write(TEXT)
        except (BrokenPipeError, OSError):
            pass

    writer = threading.Thread(target=write_forever, daemon=True)
    writer.start()
    try:
        result = stream(
            tiny_llama_folder, "--text", str(fifo), "--tokens", "2048", "--bucket", "1024", "--chunk", "512",
            "--rows", "streaming", "--json", "-",
        )  # fmt: skip
    finally:
        stop.set()
    assert result.exit_code == 0, result.output
    assert [b["end"] for b in json.loads(result.stdout)["rows"][0]["buckets"]] == [1024, 2048]


BAD = {
    "empty file": ({"text": ""}, [], "is empty"),
    "binary file": ({"text": "abc\x00def" * 400}, [], "NUL bytes: it is a binary file"),
    "shorter than one bucket": ({"text": "short text. " * 10}, [], "less than one bucket"),
    "a folder": ({}, ["--text", "{tmp}"], "is a folder"),
    "tokens 0": ({}, ["--tokens", "0"], "--tokens must be a positive number"),
    "tokens negative": ({}, ["--tokens", "-5"], "--tokens must be a positive number"),
    "bucket not a multiple of chunk": ({}, ["--bucket", "1000"], "must be a multiple of --chunk"),
    "plot path a folder": ({}, ["--plot", "{tmp}"], "is a folder"),
    "plot without a picture suffix": ({}, ["--plot", "{tmp}/plot.txt"], "ending in .png"),
    "json path in a missing folder of a file": ({}, ["--json", "{tmp}/text.txt/x.json"], "--json"),
    "unknown row": ({}, ["--rows", "streaming,fastest"], "unknown row"),
    "duo without a profile of the model": ({}, ["--rows", "duo"], "row 'duo' needs a profile"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_refused_before_the_weights_load(case, tiny_llama_folder, tmp_path, monkeypatch):
    def never(self):
        raise AssertionError("the weights were loaded before the input was checked")

    monkeypatch.setattr(resolve.ModelRef, "load_model", never)
    files, args, message = BAD[case]
    (tmp_path / "text.txt").write_text(files.get("text", TEXT))
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--text" not in args:
        args = ["--text", str(tmp_path / "text.txt"), *args]
    result = stream(tiny_llama_folder, "--tokens", "2048", "--bucket", "1024", "--chunk", "256", *args)
    assert not isinstance(result.exception, AssertionError), result.exception
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output


def test_not_utf8_and_not_a_number_are_refused(tiny_llama_folder, tmp_path):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 ".encode("latin-1") * 600)
    result = stream(tiny_llama_folder, "--text", str(tmp_path / "latin1.txt"), "--bucket", "1024", "--chunk", "256")
    assert result.exit_code == 1 and "is not UTF-8 text" in result.output
    result = stream(tiny_llama_folder, "--tokens", "many")
    assert result.exit_code == 2 and "integer" in result.output and "Traceback" not in result.output


def test_points_checked_buckets_and_the_broken_rule():
    from duocal.eval.stream import Points, StreamConfig, broken, checked_buckets

    out = []
    points = Points(out, every=512)
    assert not points.add(256, 10.0, 255) and points.add(512, 10.0, 256)
    assert len(out) == 1 and out[0][0] == 512 and out[0][1] == pytest.approx(2.718281828 ** (20 / 511))
    config = StreamConfig(tokens=16 * 1024, bucket=1024, chunk=256, fresh_checks=4)
    assert checked_buckets(config) == [1, 6, 10, 15]
    assert checked_buckets(StreamConfig(tokens=4096, bucket=1024, chunk=256, fresh_checks=1)) == [3]
    assert broken([(1, 10.0), (2, 101.0), (3, 150.0)], 10) and not broken([(1, 10.0), (2, 99.0), (3, 150.0)], 10)
    assert not broken([(1, 10.0), (2, 500.0), (3, 500.0)], 0)  # 0: never
    with pytest.raises(ValueError, match="--resolution"):
        StreamConfig(tokens=4096, bucket=1024, chunk=256, resolution=300)
    with pytest.raises(ValueError, match="--broken-ratio"):
        StreamConfig(tokens=4096, bucket=1024, chunk=256, broken_ratio=0.5)


def test_text_pieces_end_at_whitespace_and_text_without_any_still_flows():
    from duocal.eval.stream_text import PIECE_CHARS, _checked

    pieces = list(_checked(iter([b"hello wor", b"ld and\n\nmore", b" text"]), "x"))
    assert pieces == ["hello", " world and", "\n\nmore", " text"]  # words whole, "\n\n" kept together
    cjk = "\u4e2d".encode() * PIECE_CHARS
    assert [len(p) for p in _checked(iter([cjk] * 5), "y")] == [4 * PIECE_CHARS, PIECE_CHARS]
    with pytest.raises(ValueError, match="ends inside a character"):
        list(_checked(iter(["caf\u00e9".encode()[:-1]]), "z"))

"""Evaluation tables fit 80 columns when piped, and draw their rule in ASCII where UTF-8 would come out
mangled (a C / POSIX locale, where Python writes UTF-8 on its own, or a non-UTF-8 stream) (issue 38)."""

import io
import re
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from duocal.eval.passkey_retrieval import PasskeyRow
from duocal.eval.perplexity import PerplexityRow
from duocal.eval.tables import render_ppl_table, render_table
from duocal.reports.terminal import ascii_only

from helpers.paths import REPO

SINK_WINDOW = {"policy": "sink_window", "sink": 16, "recent": 64}


def passkey_rows() -> list[PasskeyRow]:
    """`make demo`'s rows (full, duo, streaming, random with seeds) at two contexts."""
    rows = []
    for context in (512, 1024):
        full = 1024 * context * 2
        for name, sparsity, bounded, seeds in (
            ("full", 0.0, 0, None),
            ("duo", 0.5, 8, None),
            ("streaming", 1.0, 16, None),
            ("random", 0.5, 8, [0, 1, 2]),
        ):
            kv = full if not bounded else full // 2 + 1234
            rows.append(
                PasskeyRow(
                    name, context, sparsity, 0.45, kv, kv + 4096, full, kv / full, 40, bounded, 16,
                    SINK_WINDOW if bounded else None, 1.0, seeds=seeds,
                    min=0.2 if seeds else None, max=0.7 if seeds else None,
                )
            )  # fmt: skip
    return rows


def printed(render, rows) -> list[str]:
    out = io.StringIO()
    render(rows, console=Console(file=out, width=80), title="passkey retrieval, demo model: 40 samples per context")
    return out.getvalue().splitlines()


def test_the_demo_passkey_table_fits_80_columns_and_keeps_every_fact():
    lines = printed(render_table, passkey_rows())
    assert max(map(len, lines)) <= 80, "\n".join(lines)
    text = "\n".join(lines)
    assert "…" not in text  # nothing cropped
    for fact in ("8/16 sink_window", "16/16 sink_window", "0/16 full", "[0.20-0.70]", "1.0 MiB", "50%", "100%"):
        assert fact in text, (fact, text)
    assert re.search(r"^random \(3 .*\n^seeds\)", text, re.MULTILINE), text  # the row name wraps


def test_the_perplexity_table_fits_80_columns():
    rows = [
        PerplexityRow(name, sparsity, 4096, 4000, 12.345, 90_000_000, 0.5, 1.0, per_seed=seeds)
        for name, sparsity, seeds in (("full", 0.0, None), ("duo", 0.5, None), ("random", 0.5, [12.1, 12.9]))
    ]
    lines = printed(render_ppl_table, rows)
    assert max(map(len, lines)) <= 80 and "…" not in "\n".join(lines), "\n".join(lines)


def test_a_stream_that_is_not_utf8_gets_an_ascii_rule():
    out = io.TextIOWrapper(io.BytesIO(), encoding="latin-1")
    assert ascii_only(out)
    assert not ascii_only(io.TextIOWrapper(io.BytesIO(), encoding="utf-8"))


def test_under_the_c_locale_the_table_is_ascii_though_python_writes_utf8():
    code = (
        f"import sys; sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(REPO / 'tests')!r}]; "
        "from test_tables_fit import passkey_rows; "
        "from duocal.eval.tables import render_table; render_table(passkey_rows(), title='demo')"
    )
    for env, want_ascii in (({"LANG": "C"}, True), ({"LANG": "C.UTF-8"}, False)):
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            env={"PATH": "/usr/bin:/bin", **env},
            cwd=REPO,
            check=True,
        )
        lines = done.stdout.decode("utf-8").splitlines()
        assert max(map(len, lines)) <= 80, (env, done.stdout)  # piped: 80 columns
        assert done.stdout.isascii() is want_ascii, (env, done.stdout[:400])
        assert any(set(line.strip()) == {"-" if want_ascii else "─"} for line in lines), lines

"""The docs outside the site build: README's and the changelog's links lead to files that exist, and
the docs' figures redraw from their saved rows (`make figures`). `make docs` checks the site itself."""

import json
import re
import struct
from pathlib import Path

import pytest

from duocal.eval.figures import draw, load_figure
from duocal.eval.figures import main as figures_main

REPO = Path(__file__).parents[1]
FIGURES = REPO / "docs" / "benchmarks" / "figures"


def relative_links(markdown: str) -> list[str]:
    """Targets of Markdown links and images that are paths in the repository (no URL, no bare anchor)."""
    targets = re.findall(r"\]\(([^)\s]+)\)", markdown)
    return [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+:|#", t)]


@pytest.mark.parametrize("name", ["README.md", "CHANGELOG.md"])
def test_links_lead_to_files(name):
    links = relative_links((REPO / name).read_text())
    missing = [link for link in links if not (REPO / link).exists()]
    assert not missing, f"{name} links to files that do not exist: {missing}"


def named_test_files(markdown: str) -> list[str]:
    """Every test file path written from the repository root (`tests/....py`) in a page: in a link, code or prose."""
    return re.findall(r"(?<![\w/.-])tests/[\w/.-]*?\.py\b", markdown)


def pages_that_name_test_files() -> list[Path]:
    docs = sorted(p for p in (REPO / "docs").rglob("*.md") if "_incoming" not in p.parts)
    return [REPO / "README.md", REPO / "CHANGELOG.md", *docs]


def test_named_test_files_finds_paths_in_any_markdown():
    page = "see `tests/runtime/x/test_a.py::test_b`, [b](../tests/test_c.py) and tests/duocal/test_d.py."
    assert named_test_files(page) == ["tests/runtime/x/test_a.py", "tests/duocal/test_d.py"]


def test_every_test_file_the_docs_name_exists():
    """The tests moved into rooms once (tests/runtime/<room>/, tests/duocal/<room>/) and the docs kept the
    old paths: a page that names a test file must name one that is there (`find tests -name test_x.py`)."""
    pages = pages_that_name_test_files()
    assert len(pages) > 20 and any(named_test_files(p.read_text()) for p in pages), "no page names a test file"
    missing = [
        f"{page.relative_to(REPO)}: {path}"
        for page in pages
        for path in named_test_files(page.read_text())
        if not (REPO / path).is_file()
    ]
    assert not missing, (
        f"pages name test files that do not exist (find the file by name: find tests -name ...): {missing}"
    )


def test_readme_links_into_every_docs_section():
    links = set(relative_links((REPO / "README.md").read_text()))
    for section in ("getting-started.md", "guides/", "reference/", "benchmarks/", "contributing/"):
        assert any(link.startswith("docs/" + section) for link in links), f"README has no link into docs/{section}"


def test_make_test_builds_the_docs_strictly():
    """CI runs `make test`; it builds the docs with --strict, never --quiet (which hides the warnings
    --strict counts: a broken link would pass)."""
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^test: .*\bdocs\b", makefile, re.M), "make test must depend on make docs"
    recipe = re.search(r"^docs: .*\n((?:\t.*\n)+)", makefile, re.M).group(1)
    assert "mkdocs build --strict" in recipe and "--quiet" not in recipe and "-q " not in recipe, recipe


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_every_figure_redraws_from_its_rows(tmp_path):
    figures = sorted(FIGURES.glob("*.json"))
    assert figures, "docs/benchmarks/figures holds no figure file"
    for figure in figures:
        copy = tmp_path / figure.name
        copy.write_text(figure.read_text())
        written = draw(copy)
        assert written == copy.with_suffix(".png")
        assert png_size(written.read_bytes()) == png_size(figure.with_suffix(".png").read_bytes())


def test_the_smollm2_figure_plots_the_table_it_shows():
    """Its rows are the SmolLM2 passkey table of benchmarks/real-model.md, at the analytic fp32 bytes."""
    rows, title, _ = load_figure(FIGURES / "smollm2-passkey.json")
    by = {(r.row, r.context): r for r in rows}
    assert title == "passkey retrieval, smollm2-135m-instruct"
    assert by["duo", 4096].kv_bytes == 107_642_880  # the quick start's printed 4k size at 50%
    assert by["full", 2048].kv_bytes == 30 * 3 * 2048 * 2 * 64 * 4
    table = (REPO / "docs" / "benchmarks" / "real-model.md").read_text()
    assert "| StreamingLLM on every head | 0.188 | 0.125 | 0.28 / 0.14 |" in table
    assert (by["streaming", 2048].exact_match, by["streaming", 4096].exact_match) == (0.188, 0.125)
    assert round(by["streaming", 4096].kv_bytes / by["full", 4096].kv_bytes, 2) == 0.14


@pytest.mark.parametrize(
    "content, words",
    [
        ("not json", "not JSON"),
        ("[]", "non-empty list of rows"),
        ('{"rows": [{"row": "full", "context": 512, "exact_match": 1.0}]}', "missing kv_bytes"),
        ('[{"row": "full", "context": "512", "exact_match": 1.0, "kv_bytes": 10}]', "context must be a finite int"),
        ('[{"row": "full", "context": 512, "exact_match": NaN, "kv_bytes": 10}]', "exact_match must be a finite float"),
        ('[{"row": "", "context": 512, "exact_match": 1.0, "kv_bytes": 10}]', "row must be a non-empty string"),
        ('{"tune": {"table": [{"sparsity": 0.5}]}}', "the record `duocal tune --json` prints"),
    ],
)
def test_a_bad_figure_file_is_one_error_line_and_no_png(tmp_path, capsys, content, words):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    with pytest.raises(SystemExit) as done:
        figures_main([str(bad)])
    stderr = capsys.readouterr().err
    assert done.value.code == 1
    assert stderr.startswith(f"error: {bad}") and words in stderr and len(stderr.splitlines()) == 1, stderr
    assert not bad.with_suffix(".png").exists()


def test_a_bare_json_list_of_rows_draws_without_a_title(tmp_path):
    rows = [{"row": "full", "context": 512, "exact_match": 1.0, "kv_bytes": 2**20, "samples": 4, "policy": "full"}]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    assert png_size(draw(path).read_bytes())[0] > 0

"""The docs outside the site build: README's and the changelog's links lead to files that exist, every
repository path that a page, a docstring, a comment, pyproject.toml or the Makefile names exists, README keeps its
shape and its numbers agree with the benchmark pages, user pages tell no history, and the docs' figures redraw
from their saved rows (`make figures`). `make docs` checks the site itself."""

import ast
import io
import json
import re
import struct
import tokenize
from pathlib import Path

import pytest

from benchmarks.figures import draw, load_figure
from benchmarks.figures import main as figures_main

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


def markdown_pages() -> list[Path]:
    return [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_named_test_files_finds_paths_in_any_markdown():
    page = "see `tests/runtime/x/test_a.py::test_b`, [b](../tests/test_c.py) and tests/duocal/test_d.py."
    assert named_test_files(page) == ["tests/runtime/x/test_a.py", "tests/duocal/test_d.py"]


def test_every_test_file_the_docs_name_exists():
    """The tests moved into rooms once (tests/runtime/<room>/, tests/duocal/<room>/) and the docs kept the
    old paths: a page that names a test file must name one that is there (`find tests -name test_x.py`)."""
    pages = markdown_pages()
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


# A repository path: folders joined by "/", ending in a file with one of these suffixes or in "/" (a folder).
REPO_PATH = re.compile(
    r"(?<![\w./$-])((?:[\w.-]+/)+(?:[\w-]+\.(?:py|md|json|ya?ml|toml|txt|c|h|sh|tsv|png)\b|(?=[\s`)'\",:;]|$)))"
)
SOURCE_FOLDERS = ("duocal", "runtime", "vllm_plugin", "benchmarks", "tests", "recipes", "docs/_hooks")
# Top folders that git ignores (`/out/`, `/runs/`): what a command writes there is never in a clone.
IGNORED = {(REPO, name) for name in re.findall(r"^/([\w.-]+)/$", (REPO / ".gitignore").read_text(), re.M)}


def named_paths(text: str) -> list[str]:
    """Paths with at least one "/" that end in a file name with a known suffix or in "/"."""
    return [m.rstrip("/") for m in REPO_PATH.findall(text)]


def missing_paths(text: str, where: Path) -> list[str]:
    """Named paths that do not exist. A path is read from the repository root, from docs/ (mkdocs.yml's nav and
    the pages name `benchmarks/tune.md`, beside the top folder benchmarks/) or, for a module's docstring,
    from any folder above the module (`profile/format.py` in runtime/); a path whose first folder is none of
    those (`transformers/cache_utils.py`) or one git ignores (`out/demo/`) names something outside the repository
    and is not checked."""
    roots = [REPO, REPO / "docs", *(parent for parent in where.parents if REPO in parent.parents)]
    missing = []
    for path in named_paths(text):
        first = path.split("/", 1)[0]
        candidates = [root for root in roots if (root / first).is_dir() and (root, first) not in IGNORED]
        if candidates and not any((root / path).exists() for root in candidates):
            missing.append(path)
    return missing


def docstrings_and_comments(source: str) -> str:
    """Every module, class and function docstring and every comment of a Python file, one after another."""
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    docs = [ast.get_docstring(n, clean=False) for n in ast.walk(ast.parse(source)) if isinstance(n, kinds)]
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return "\n".join([*filter(None, docs), *(t.string for t in tokens if t.type == tokenize.COMMENT)])


def test_named_paths_finds_files_and_folders_and_skips_prose():
    text = "see runtime/profile/format.py, `tests/vllm/` and docs/index.md#x; tok/s and/or a KV head's 1/2"
    assert named_paths(text) == ["runtime/profile/format.py", "tests/vllm", "docs/index.md"]
    assert missing_paths("runtime/gone.py and out/demo/profile.json", REPO / "Makefile") == ["runtime/gone.py"]
    assert missing_paths("profile/measurements.py", REPO / "runtime" / "profile" / "format.py") == []


def test_every_path_in_docstrings_comments_pages_pyproject_and_the_makefile_exists():
    """Files move into rooms, and a docstring, a comment, a page or the build that names the old place sends the
    reader nowhere: every path they name must be there (the changelog names old places on purpose)."""
    sources = sorted(p for folder in SOURCE_FOLDERS for p in (REPO / folder).rglob("*.py"))
    texts = [(p, docstrings_and_comments(p.read_text())) for p in sources]
    texts += [(REPO / name, (REPO / name).read_text()) for name in ("pyproject.toml", "Makefile", "mkdocs.yml")]
    texts += [(page, page.read_text()) for page in markdown_pages() if page.name != "CHANGELOG.md"]
    assert len(texts) > 100, "the check reads too few files"
    problems = [f"{path.relative_to(REPO)}: {m}" for path, text in texts for m in missing_paths(text, path)]
    assert not problems, "paths that do not exist (the file moved: name where it is now):\n" + "\n".join(problems)


def test_readme_links_into_every_docs_section():
    links = set(relative_links((REPO / "README.md").read_text()))
    for section in ("getting-started.md", "guides/", "reference/", "benchmarks/", "contributing/"):
        assert any(link.startswith("docs/" + section) for link in links), f"README has no link into docs/{section}"


README_SECTIONS = ["Install", "Quick start", "What you get", "Serve, and vLLM", "Documentation", "Citation"]


def test_readme_is_short_and_in_the_order_a_reader_needs():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150, "README.md is over 150 lines: move detail into docs/"
    assert re.findall(r"^## (.+)$", readme, re.M) == README_SECTIONS
    install = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"^pip install -c constraints.txt ", install, re.M), "no plain pip install line"
    assert re.search(r"^make demo ", install, re.M) and re.search(r"^make test ", install, re.M)
    citation = readme.split("## Citation", 1)[1]
    for arxiv_title in ("DuoAttention", "Heavy-Hitter Oracle", "Attention Sinks"):
        assert re.search(r"@\w+\{\w+,\n  title\s*= \{[^\n]*" + arxiv_title, citation), arxiv_title


def test_readme_results_are_the_benchmark_pages_numbers():
    """One number per fact: README's table is the passkey table of benchmarks/real-model.md, row for row, and
    every number of its GPU paragraph is in the H200 table of benchmarks/runtime.md."""
    readme = (REPO / "README.md").read_text()
    rows = [line for line in readme.split("## What you get", 1)[1].splitlines() if line.startswith("|")]
    quality = (REPO / "docs" / "benchmarks" / "real-model.md").read_text()
    assert len(rows) == 7 and all(row in quality.splitlines() for row in rows), rows
    gpu = readme.split("**On one H200**", 1)[1].split("\n\n", 1)[0]
    h200 = (REPO / "docs" / "benchmarks" / "runtime.md").read_text().split("## On one H200", 1)[1].split("\n## ")[0]
    cells = set(re.findall(r"(?<=\| )\**([\d.]+)\**(?= \|)", h200))
    numbers = [n for n in re.findall(r"\b(\d+\.\d+)x?\b", gpu)]
    assert len(numbers) >= 6 and not set(numbers) - cells, sorted(set(numbers) - cells)


# What user pages never say: the history of the work (issue numbers, dates, load averages). The changelog is
# history by design.
HISTORY = re.compile(r"\bissue \d+|\b20\d\d-\d\d-\d\d\b|\bload(?: average)? [\d~]|\b\d\d:\d\d UTC\b", re.I)


def test_the_history_check_finds_each_kind_and_spares_the_product():
    text = "(issue 38) measured 2026-12-03 19:06 UTC at load 2-3, load average 5-9, load ~2"
    assert [m.group(0) for m in HISTORY.finditer(text)] == [
        "issue 38",
        "2026-12-03",
        "19:06 UTC",
        "load 2",
        "load average 5",
        "load ~",
    ]
    assert not HISTORY.search("it loads the weights; load_profile(path); the load average before and after; 21:55")


def test_user_pages_tell_what_the_product_does_not_the_history_of_the_work():
    pages = [p for p in markdown_pages() if p.name not in ("CHANGELOG.md", "changelog.md")]
    found = [f"{p.relative_to(REPO)}: {m.group(0)!r}" for p in pages for m in HISTORY.finditer(p.read_text())]
    assert not found, "say what the product does and how to check it, not when or under which load:\n" + "\n".join(
        found
    )


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

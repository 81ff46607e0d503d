"""The suite's own house rules: tests/ mirrors the source rooms, test file names are unique, each fixture has one
owner and no test imports a conftest, and `make test`'s pytest-xdist workers share the suite as conftest.py says."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# tests/runtime/<room>/, tests/duocal/<room>/ and tests/benchmarks/<room>/ hold the tests of runtime/<room>/,
# duocal/<room>/ and benchmarks/<room>/; a test file directly in tests/runtime/ or tests/duocal/ tests that
# package's top modules (checks.py, errors.py...).
TEST_MIRRORS = {"runtime": REPO / "runtime", "duocal": REPO / "duocal", "benchmarks": REPO / "benchmarks"}
# vllm: the plugin's tests, run in .venv-vllm; data: reference files; helpers: the builders the tests share
TEST_FOLDERS = {*TEST_MIRRORS, "vllm", "data", "helpers"}
PROJECT_WIDE_TESTS = {
    "test_architecture.py",
    "test_docs.py",
    "test_lint.py",
    "test_packaging.py",
    "test_real_model.py",
    "test_suite_layout.py",
}


def stray_test_files() -> list[str]:
    """Test files in a folder that mirrors no source room, or at tests/ top without being project-wide."""
    tests = REPO / "tests"
    stray = [str(p.relative_to(REPO)) for p in tests.glob("test_*.py") if p.name not in PROJECT_WIDE_TESTS]
    stray += [str(p.relative_to(REPO)) + "/" for p in tests.iterdir() if p.is_dir() and p.name not in TEST_FOLDERS]
    for mirror, source in TEST_MIRRORS.items():
        for path in (tests / mirror).rglob("*.py"):
            folders = path.parent.relative_to(tests / mirror).parts
            if folders and not (source.joinpath(*folders) / "__init__.py").is_file():
                stray.append(str(path.relative_to(REPO)))
    return sorted(s for s in stray if "__pycache__" not in s)


def test_the_tests_mirror_the_source_rooms():
    """Tests sit in the room of the code they test, so tests/ reads as the architecture."""
    stray = stray_test_files()
    assert not stray, (
        f"not in a mirrored room: {stray} (move each to tests/runtime/<room>/ or tests/duocal/<room>/ of the code "
        f"it tests; tests/ top holds only {sorted(PROJECT_WIDE_TESTS)} and the shared helpers)"
    )


def test_test_file_names_are_unique():
    """Test modules are imported by their file name (pytest's default import mode, no __init__.py)."""
    seen: dict[str, Path] = {}
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        if path.relative_to(REPO / "tests").parts[0] == "vllm":
            continue  # collected only by `make vllm-test`, in its own run
        assert path.name not in seen, f"{path.relative_to(REPO)} and {seen[path.name].relative_to(REPO)} share a name"
        seen[path.name] = path


def test_each_fixture_has_one_owner_and_no_test_imports_a_conftest():
    """A fixture is defined once in the tests (vllm's included); shared code comes from tests/helpers/, never
    `from conftest import` (each folder's conftest.py is a module named `conftest`: the import finds whichever
    pytest loaded last)."""
    owners: dict[str, list[str]] = {}
    imports = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        tree, where = ast.parse(path.read_text()), str(path.relative_to(REPO))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(
                ast.unparse(d).startswith("pytest.fixture") for d in node.decorator_list
            ):
                owners.setdefault(node.name, []).append(where)
            if isinstance(node, ast.ImportFrom) and node.module == "conftest" and path.name != "conftest.py":
                imports.append(where)
    assert not {name: paths for name, paths in owners.items() if len(paths) > 1}
    assert not imports, f"import these from tests/helpers/ instead of conftest: {imports}"


def test_modules_that_share_a_session_server_run_on_one_pytest_xdist_worker():
    from helpers.worker_groups import slow_groups_first, worker_groups

    alone = {"a.py": set(), "b.py": {"demo_server"}, "c.py": {"smollm2_server"}, "e.py": {"demo_server"}}
    assert worker_groups(alone) == {
        "a.py": "a.py",
        "b.py": "demo_server",
        "c.py": "smollm2_server",
        "e.py": "demo_server",
    }
    joined = {**alone, "d.py": {"smollm2_server", "demo_server"}}  # one module using both: one worker starts both
    assert set(worker_groups(joined).values()) == {"a.py", "demo_server+smollm2_server"}
    groups, slow = ["a", "a", "b", "b", "c", "d", "e"], [False, False, False, True, False, True, True]
    own = [False, False, False, False, False, False, True]  # e: a test's own mark
    assert slow_groups_first(groups, slow, own) == [6, 2, 3, 5, 0, 1, 4]  # then b and d (slow); a module stays whole


def test_a_pytest_xdist_worker_runs_the_slow_groups_first():
    """The order conftest.py sets must hold where xdist collects: on its workers (the controller collects nothing,
    and there `--dist` reads "no"). Given after a fast module, a module with a slow test still runs first."""
    import subprocess
    import sys

    fast, slow = "tests/duocal/tuning/test_tune_rule.py", "tests/runtime/policies/test_h2o_quantized.py"
    options = ["-n", "1", "--dist", "loadgroup", "--no-loadscope-reorder", "-v", "-p", "no:cacheprovider"]
    picked = ["-k", "token_codes_round_trip or flat_curve"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *options, *picked, fast, slow],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    ran = [line.split("PASSED ")[1].split("::")[0] for line in done.stdout.splitlines() if "PASSED " in line]
    assert done.returncode == 0 and len(ran) == 3, done.stdout[-2000:]
    assert ran == [slow, slow, fast]

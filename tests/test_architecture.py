"""The house rules of the source tree, checked from the code itself: no import cycle between
project modules (imports inside functions count), the runtime never imports duocal / deepspeed /
datasets, every module says in its first line what it holds, no source file is over 400 lines (a warning over 300)
(ruff-formatted at 120 columns), no module-level name means two things in one package, no two
modules share a file name, ruff is clean, the command line starts without torch, the docs'
layout table (docs/contributing/architecture.md) names the tree as it is, and
the names use the glossary's words (docs/contributing/glossary.md: no retired spelling, no bare "window")."""

import ast
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from helpers.glossary import retired_spellings, unqualified_names

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"duocal": REPO / "duocal", "duocal_runtime": REPO / "runtime", "duocal_vllm": REPO / "vllm_plugin"}
WARN_LINES = 300  # a warning: time to look for the second idea in the file
MAX_LINES = 400  # a failure


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every project module (profiles/ holds only data)."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((package, *parts))] = path
    return found


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules `name` imports anywhere in its file (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    edges = {name: imported(name, path, set(mods)) for name, path in mods.items()}
    # importing a module runs its packages' __init__ first: an edge to a package is an edge to its __init__
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node], _ = 1, stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node], _ = 2, stack.pop()
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def is_package_init_edge(a: str, b: str) -> bool:
    """`pkg/__init__.py` re-exporting its own submodules is not a cycle a reader trips over."""
    return b.startswith(a + ".")


def test_no_import_cycles_anywhere_counting_imports_inside_functions():
    edges = {a: {b for b in bs if not is_package_init_edge(a, b)} for a, bs in graph().items()}
    assert find_cycle(edges) is None, f"import cycle: {' -> '.join(find_cycle(edges))}"


def test_the_runtime_imports_nothing_of_duocal_and_no_training_stack():
    for name, path in modules().items():
        if name.startswith("duocal_runtime"):
            tree = ast.parse(path.read_text())
            roots = {
                alias.name.split(".")[0]
                for node in ast.walk(tree)
                if isinstance(node, ast.Import)
                for alias in node.names
            }
            roots |= {
                node.module.split(".")[0]
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module and not node.level
            }
            assert not roots & {"duocal", "deepspeed", "datasets", "typer", "rich", "matplotlib"}, name


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_module_says_what_it_holds_and_stays_small(name):
    path = modules()[name]
    text = path.read_text()
    doc = ast.get_docstring(ast.parse(text))
    assert doc and doc.strip(), f"{path.relative_to(REPO)} has no module docstring"
    lines = len(text.splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(REPO)} has {lines} lines"
    if lines > WARN_LINES:
        warnings.warn(
            f"{path.relative_to(REPO)} has {lines} lines (over {WARN_LINES}): does it hold two ideas?", stacklevel=1
        )


# Names that mean the same kind of thing wherever they are (entry points).
SHARED_NAMES = {"main", "logger"}


def top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("__")}


def test_no_module_level_name_is_defined_in_two_modules_of_a_package():
    for package in PACKAGES:
        where: dict[str, list[str]] = {}
        for name, path in modules().items():
            if name.startswith(package + ".") or name == package:
                for defined in top_level_names(path):
                    where.setdefault(defined, []).append(name)
        twice = {n: ms for n, ms in where.items() if len(ms) > 1 and n not in SHARED_NAMES}
        assert not twice, f"defined in several modules of {package}: {twice}"


def test_no_two_modules_share_a_file_name():
    """Command modules (duocal/cli/) are named for the command they define and are exempt."""
    seen: dict[str, Path] = {}
    for path in modules().values():
        if path.name in ("__init__.py", "__main__.py") or path.parent == REPO / "duocal" / "cli":
            continue
        assert path.name not in seen, f"{path.relative_to(REPO)} and {seen[path.name].relative_to(REPO)}"
        seen[path.name] = path


def test_the_cli_takes_the_profiler_seed_and_the_row_names_from_their_owners():
    """They live once, in torch-free modules of their rooms (the CLI's start without torch is checked below)."""
    from duocal.cli import options
    from duocal.cli import profiler as profiler_command
    from duocal.eval import ROW_NAMES
    from duocal.eval.row_kinds import ROWS
    from duocal.profiling import PROFILER_SEED, profiler

    assert profiler_command.PROFILER_SEED is PROFILER_SEED and profiler.ProfilerConfig().seed == PROFILER_SEED
    assert options.ROW_NAMES is ROW_NAMES and tuple(ROWS) == ROW_NAMES


def test_ruff_format_and_lint_are_clean():
    for args in (["format", "--check", "--quiet"], ["check", "--quiet"]):
        done = subprocess.run([sys.executable, "-m", "ruff", *args, str(REPO)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_command_line_starts_without_torch_and_fast():
    """`duocal --help` and `duocal profiles list` import neither torch nor transformers (measured
    here: 0.2 s and 0.27 s, against 5 s when the CLI imported the runtime at start)."""
    code = (
        "import sys, time; t = time.perf_counter(); import duocal.cli.app; "
        "print(sorted({'torch', 'transformers', 'deepspeed'} & set(sys.modules)), time.perf_counter() - t)"
    )
    heavy, _ = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(
        "] "
    )
    assert heavy == "[", heavy
    for args in (["--help"], ["profiles", "list"]):
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", "from duocal.cli import app; app()", *args], capture_output=True, check=True
        )
        assert time.perf_counter() - started < 2.0, args  # generous: a loaded CI machine


LAYOUT_PAGE = "docs/contributing/architecture.md"  # its "## Layout" table, one row per package folder


def test_layout_table_names_the_tree():
    """The docs' layout table names every module and sub-package at the top of runtime/ and duocal/,
    and every file or folder it names exists (nested ones anywhere below)."""
    page = (REPO / LAYOUT_PAGE).read_text()
    table = page.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)/` \|[^|]*\|(.*)\|\s*$", table, re.M)}
    for folder in ("runtime", "duocal", "vllm_plugin"):
        named = set(re.findall(r"`(\w+\.py|\w+/)`", rows[folder]))
        top = {p.name for p in (REPO / folder).glob("*.py") if p.name != "__init__.py"}
        top |= {p.name + "/" for p in (REPO / folder).iterdir() if (p / "__init__.py").is_file()}
        assert top <= named, f"{LAYOUT_PAGE}: the layout table does not name {sorted(top - named)} in {folder}/"
        anywhere = {p.name for p in (REPO / folder).rglob("*.py")} | {p.name + "/" for p in (REPO / folder).rglob("*")}
        assert named <= anywhere, f"{LAYOUT_PAGE}: the layout table names {sorted(named - anywhere)}, not in {folder}/"


# The layers, lowest first. A module imports only modules of its own room (a sub-package, or a
# module at the package's top) or of a room in a lower layer; either package's `__init__` (lazy
# re-exports) may be imported from anywhere. `duocal` sits above the whole runtime.
LAYERS = [
    {"duocal_runtime.errors"},
    {"duocal_runtime.checks", "duocal_runtime.compat", "duocal_runtime.files"},
    {"duocal_runtime.attention", "duocal_runtime.quant"},
    {"duocal_runtime.policies"},
    {"duocal_runtime.profile"},
    {"duocal_runtime.planning", "duocal_runtime.fetching"},
    {"duocal_runtime.paged"},
    {"duocal_runtime.hf"},
    {"duocal_vllm"},  # the vLLM plugin: one room, on the runtime alone
    {"duocal.reports", "duocal.data"},
    {"duocal.models"},
    {"duocal.measure"},  # the one way duocal asks a model under a plan and scores it
    {"duocal.calibrate", "duocal.eval"},
    {"duocal.profiling", "duocal.demo", "duocal.serving", "duocal.tuning", "duocal.chat"},
    {"duocal.cli"},
    {"duocal.__main__"},
]


def room(module: str) -> str:
    """A module's room: package and first folder (`duocal_runtime.planning.plan` -> `duocal_runtime.planning`)."""
    return "duocal_vllm" if module.startswith("duocal_vllm") else ".".join(module.split(".")[:2])


def test_every_room_has_a_layer():
    rooms = {room(m) for m in modules() if m not in PACKAGES}
    assert rooms == set().union(*LAYERS), f"rooms without a layer: {rooms - set().union(*LAYERS)}"


def imports_of(path: Path) -> set[str]:
    """Every absolute module name a file imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_the_packages_never_import_the_benchmarks():
    """benchmarks/ (the workshop: benchmarks and the docs' figure tools) stands outside the installed packages,
    which ship without it: a package module importing it would fail in every installed copy."""
    leaning = sorted(
        name for name, path in modules().items() if any(m.split(".")[0] == "benchmarks" for m in imports_of(path))
    )
    assert not leaning, f"these modules import benchmarks/, which is not installed: {leaning}"


def test_no_module_imports_a_room_of_its_own_layer_or_a_higher_one():
    layer = {r: i for i, rooms in enumerate(LAYERS) for r in rooms}
    upward = [
        f"{a} -> {b}"
        for a, targets in graph().items()
        if a not in PACKAGES
        for b in targets
        if b not in PACKAGES and room(a) != room(b) and layer[room(b)] >= layer[room(a)]
    ]
    assert not upward, "imports against the layer order:\n" + "\n".join(sorted(upward))


# One word per idea (docs/contributing/glossary.md): the words, and the names kept, are in helpers/glossary.py.


# The glossary names the words it retires; the changelog tells what was renamed when.
PAGES_THAT_NAME_RETIRED_WORDS = {"docs/contributing/glossary.md", "CHANGELOG.md"}


def text_files() -> list[Path]:
    """The docs, README, the Makefile and the configuration: what users and the build read besides the code."""
    named = [REPO / n for n in ("README.md", "CHANGELOG.md", "Makefile", "pyproject.toml", "mkdocs.yml", ".ci/run")]
    found = [*named, *(REPO / "docs").rglob("*.md"), *(REPO / "recipes").rglob("*.yaml")]
    return [p for p in found if str(p.relative_to(REPO)) not in PAGES_THAT_NAME_RETIRED_WORDS]


def glossary_sources() -> list[Path]:
    """The Python of the three packages, the tests and the recipes, but this file and helpers/glossary.py, which
    name the spellings they ban."""
    banning = {Path(__file__).resolve(), REPO / "tests" / "helpers" / "glossary.py"}
    found = [*modules().values(), *(REPO / "tests").rglob("*.py"), *(REPO / "recipes").rglob("*.py")]
    return [p for p in found if p.resolve() not in banning]


def test_no_retired_word_comes_back():
    """Every source file of the three packages, the tests and the recipes, the C kernels, the docs, the Makefile
    and the configuration."""
    sources = [*glossary_sources(), *(REPO / "runtime").rglob("*.[ch]"), *text_files()]
    assert len(text_files()) > 30, "the docs and configuration were not found"
    problems = [f"{path.relative_to(REPO)}: {p}" for path in sources for p in retired_spellings(path.read_text())]
    assert not problems, "\n".join(problems)


def test_every_window_name_says_which_window():
    """A bare "window" named five things: a name says sink_window (or recent), observation_window, text_window(s)
    or key_blocks (the glossary's table); helpers/glossary.py keeps a few names, each with why."""
    sources = glossary_sources()
    assert len(sources) > 300, "the sources were not found"
    problems = [f"{path.relative_to(REPO)}: {p}" for path in sources for p in unqualified_names(path.read_text())]
    advice = "say sink_window (or recent), observation_window, text_window(s) or key_blocks:\n"
    assert not problems, advice + "\n".join(problems)


def test_the_retired_word_check_finds_each_kind_and_spares_decoded():
    text = "class StaticCodedH2OGroup: ...\nfrom x import compat as hf_compat  # the coded history\ndecoded = encode(x)"
    assert retired_spellings(text) == [
        "identifier 'StaticCodedH2OGroup': say quantized (the integers are codes)",
        "identifier 'coded': say quantized (the integers are codes)",  # the comment's word, seen both ways
        "identifier 'hf_compat': say compat",
        "word 'coded': see the glossary",
    ]
    assert retired_spellings("token_coded_bytes; non-retrieval heads") == [
        "identifier 'token_coded_bytes': say quantized (the integers are codes)",
        "word 'non-retrieval': see the glossary",
    ]


def test_the_window_check_finds_each_kind_and_spares_the_kept_names():
    source = (
        "class SnapKV:\n    window: int = 32\n"
        "def row_window(window, *, windows=2):\n"
        "    first_window_block = SnapKV(window=4).window + config.sliding_window  # a window, in words\n"
        "    return [text_window for text_window in text_windows(windows)] + sink_window.recent\n"
    )
    assert unqualified_names(source) == [
        "line 3: argument 'window'",  # SnapKV's field is kept as a member, an attribute and a keyword only
        "line 3: argument 'windows'",
        "line 3: function 'row_window'",
        "line 4: name 'first_window_block'",  # not sliding_window (transformers'), nor the comment's word
        "line 5: name 'windows'",  # not text_window(s), nor sink_window
    ]
    assert retired_spellings("cache.capacity_bytes()") == [
        "identifier 'capacity_bytes': say pool_size (the pool's bytes)"
    ]

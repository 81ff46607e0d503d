"""The house rules of the source tree, checked from the code itself (ast, no imports run):
no import cycle between project modules (imports inside functions count), the runtime never
imports duocal / deepspeed / datasets, every module says in its first line what it holds, and
no source file is over 300 lines."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"duocal": REPO / "duocal", "duocal_runtime": REPO / "runtime"}
MAX_LINES = 300


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
                return stack[stack.index(nxt):] + [nxt]
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
            roots = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                     for alias in node.names}
            roots |= {node.module.split(".")[0] for node in ast.walk(tree)
                      if isinstance(node, ast.ImportFrom) and node.module and not node.level}
            assert not roots & {"duocal", "deepspeed", "datasets", "typer", "rich", "matplotlib"}, name


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_module_says_what_it_holds_and_stays_small(name):
    path = modules()[name]
    text = path.read_text()
    doc = ast.get_docstring(ast.parse(text))
    assert doc and doc.strip(), f"{path.relative_to(REPO)} has no module docstring"
    assert len(text.splitlines()) <= MAX_LINES, f"{path.relative_to(REPO)} has {len(text.splitlines())} lines"

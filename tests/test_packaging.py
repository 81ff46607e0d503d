import re
import subprocess
import sys
import tomllib

from conftest import REPO

# accelerate is not listed: transformers itself imports it when it is installed.
FORBIDDEN = ("deepspeed", "datasets", "duocal", "typer", "matplotlib", "rich")


def test_runtime_imports_nothing_heavy():
    code = (
        "import sys, duocal_runtime\n"
        f"bad = sorted({{m.split('.')[0] for m in sys.modules}} & set({FORBIDDEN!r}))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_runtime_source_never_imports_duocal():
    for path in (REPO / "runtime").rglob("*.py"):
        text = path.read_text()
        for name in FORBIDDEN:
            pattern = rf"^\s*(import|from)\s+{name}(\s|\.|$)"
            assert not re.search(pattern, text, re.M), f"{path} imports {name}"


def test_every_package_folder_is_listed_in_pyproject():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    dirs = config["package-dir"]
    mapped_folders = {REPO / folder for folder in dirs.values()}
    for package, folder in dirs.items():
        for init in (REPO / folder).rglob("__init__.py"):
            if any(init.parent != REPO / folder and init.parent.is_relative_to(m) and m != REPO / folder
                   for m in mapped_folders):
                continue  # a sub-folder mapped to its own package name
            name = ".".join([package, *init.parent.relative_to(REPO / folder).parts])
            assert name in listed, f"{name} ({init.parent}) is missing from pyproject's packages list"

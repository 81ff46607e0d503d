"""`make lint`'s unreachable-code check (ruff has no such rule): the Makefile's own vulture command, run on a
planted module, fails on a method left after a `return` and passes a clean module."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV = Path(sys.executable).parent.parent

PLANTED = """
class Backend:
    def forward(self, x):
        return x + 1

        def reset(self):  # meant as a method of Backend, indented one level too deep after the return
            self.state = None
"""

CLEAN = """
class Backend:
    def forward(self, x):
        return x + 1

    def reset(self):
        self.state = None
"""


def unreachable_check(folder: Path) -> str:
    """The vulture line of `make lint`, as make prints it with LINTED set to `folder`."""
    printed = subprocess.run(
        ["make", "-n", "lint", f"LINTED={folder}", f"VENV={VENV}"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    lines = [line for line in printed if "vulture" in line]
    assert len(lines) == 1 and str(folder) in lines[0], printed
    return lines[0]


def run_check(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "backend.py").write_text(source)
    return subprocess.run(["bash", "-c", unreachable_check(folder)], cwd=REPO, capture_output=True, text=True)


def test_a_method_after_a_return_fails_the_lint(tmp_path):
    found = run_check(tmp_path, PLANTED)
    assert found.returncode != 0
    assert "backend.py:6: unreachable code after 'return'" in found.stdout


def test_a_clean_module_passes_the_lint(tmp_path):
    found = run_check(tmp_path, CLEAN)
    assert found.returncode == 0, found.stdout + found.stderr
    assert found.stdout == ""

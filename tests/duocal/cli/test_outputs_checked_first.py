"""Every command that writes checks its output first (issue 47): an output it cannot write is one
`error:` line naming the option and the path, in well under 2 s, before the model is resolved or
any work starts, and nothing is made. Outputs it can write reach the work (the sentinel below), so
the sentinels are the functions the commands really call."""

import os
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.calibrate import recipe as recipe_module
from duocal.cli.app import app
from duocal.models.resolve import ModelRef

from helpers.paths import REPO, UPSTREAM_PATTERNS

PATTERN = str(UPSTREAM_PATTERNS / "Mistral-7B-Instruct-v0.2")
DEMO_PROFILE = str(REPO / "profiles" / "demo-model.json")
SENTINEL = "the work started"
WRITABLE = str(Path(tempfile.gettempdir()) / "duocal-never-written.json")  # the sentinel stops the command first

# command -> (arguments with {out}, the option named in errors, output kind: file name or "folder")
COMMANDS = {
    "profile": (["profile", "--output", "{out}"], "--output", "p.json"),
    "eval passkey --plot": (["eval", "passkey", "--plot", "{out}"], "--plot", "p.png"),
    "profiles import-upstream": (["profiles", "import-upstream", PATTERN, "-o", "{out}"], "--output", "p.json"),
    "calibrate": (["calibrate", "--output", "{out}"], "--output", "folder"),
    "profiles export-upstream": (["profiles", "export-upstream", DEMO_PROFILE, "-o", "{out}"], "--output", "folder"),
    "recipes copy": (["recipes", "copy", "calibrate_demo", "{out}"], "FOLDER", "folder"),
    "tune": (["tune", "smollm2-135m-instruct", "--output", "{out}"], "--output", "p.json"),
    "tune --plot": (["tune", "smollm2-135m-instruct", "--output", WRITABLE, "--plot", "{out}"], "--plot", "p.png"),
}

# case -> (the output, relative to the test's folder, and what is made there first); {name} is the
# command's file name, "run" for folder outputs
REFUSED_FILES = {
    "missing folder under a file": ("a-file/missing/{name}", None),
    "read-only folder": ("ro/{name}", None),
    "missing folder in a read-only folder": ("ro/missing/{name}", None),
    "a folder": ("{name}", "folder"),
    "a fifo": ("{name}", "fifo"),
    "a link to a fifo": ("{name}", "link to a fifo"),
    "a link to a folder": ("{name}", "link to a folder"),
}
REFUSED_FOLDERS = {
    "missing folder under a file": ("a-file/run", None),
    "read-only folder": ("ro/run", None),
    "a read-only folder itself": ("ro", None),
    "a file": ("a-file", None),
    "a fifo": ("{name}", "fifo"),
    "a link to a fifo": ("{name}", "link to a fifo"),
}
ACCEPTED_FILES = {
    "missing folders in a writable folder": ("new/sub/{name}", None),
    "a link to a file": ("{name}", "link to a file"),
}
ACCEPTED_FOLDERS = {
    "missing folders in a writable folder": ("new/sub/{name}", None),
    "an empty folder": ("{name}", "folder"),
}


def matrix(files: dict, folders: dict) -> list:
    return [
        pytest.param(command, (folders if kind == "folder" else files)[case], id=f"{command}: {case}")
        for command, (_, _, kind) in COMMANDS.items()
        for case in (folders if kind == "folder" else files)
    ]


@pytest.fixture
def sentinels(monkeypatch):
    """The first function each command calls once its output is checked fails the test when called."""

    def started(*args, **kwargs):
        raise AssertionError(SENTINEL)

    monkeypatch.setattr(ModelRef, "resolve", classmethod(started))  # profile, eval passkey, calibrate
    monkeypatch.setattr(ModelRef, "load_model", started)
    monkeypatch.setattr(dr, "import_upstream", started)
    monkeypatch.setattr(dr, "export_upstream", started)
    monkeypatch.setattr(recipe_module, "copy_recipe", started)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def place(tmp_path):
    """A folder with a file, an empty folder and a read-only one (made writable again afterwards)."""
    (tmp_path / "a-file").write_text("")
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o500)
    yield tmp_path
    (tmp_path / "ro").chmod(0o700)


def output_path(place: Path, command: str, relative: str, made: str | None) -> Path:
    """The case's output path for `command`, with what the case needs made there."""
    name = COMMANDS[command][2]
    path = place / relative.format(name="run" if name == "folder" else name)
    node = place / f"target-{path.name}" if made and made.startswith("link to") else path
    if made is not None and made.endswith("folder"):
        node.mkdir()
    elif made is not None and made.endswith("fifo"):
        os.mkfifo(node)
    elif made == "link to a file":
        node.write_text("{}")
    if node != path:
        path.symlink_to(node)
    return path


def tree(folder: Path) -> dict[str, tuple[int, float]]:
    return {str(p): (p.lstat().st_mode, p.lstat().st_mtime) for p in folder.rglob("*")}


def invoke(command: str, out: Path):
    args = [a.replace("{out}", str(out)) for a in COMMANDS[command][0]]
    started = time.monotonic()
    result = CliRunner().invoke(app, args)
    return result, time.monotonic() - started


@pytest.mark.parametrize("command,case", matrix(REFUSED_FILES, REFUSED_FOLDERS))
def test_an_output_that_cannot_be_written_is_refused_first(command, case, place, sentinels):
    relative, made = case
    if relative.startswith("ro") and os.access(place / "ro", os.W_OK):
        pytest.skip("this user writes in a read-only folder (root): nothing to refuse")
    out = output_path(place, command, relative, made)
    before = tree(place)
    result, seconds = invoke(command, out)
    assert not isinstance(result.exception, AssertionError), f"the work started before {out} was checked"
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    option = COMMANDS[command][1]
    assert f"error: {option} {out}" in result.stderr and "give " in result.stderr, result.stderr
    assert seconds < 2, f"refused after {seconds:.1f} s"
    assert tree(place) == before, "a refused command made or changed something"


@pytest.mark.parametrize("command,case", matrix(ACCEPTED_FILES, ACCEPTED_FOLDERS))
def test_an_output_that_can_be_written_reaches_the_work(command, case, place, sentinels):
    result, _ = invoke(command, output_path(place, command, *case))
    assert isinstance(result.exception, AssertionError) and str(result.exception) == SENTINEL, result.output

"""`duocal recipes ...`: the calibration recipes duocal ships (package data), and copying one out."""

from __future__ import annotations

import json
import shutil
import textwrap
from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from .options import JsonOpt
from .user_errors import user_errors

recipes_app = typer.Typer(help="List the shipped calibration recipes, or copy one out to edit.", no_args_is_help=True)


def summary(path: Path) -> str:
    """The first paragraph of a recipe's header comment, on one line (its closing ':' dropped)."""
    paragraph = []
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.strip("# ") if line.startswith("#") else None
        if text:
            paragraph.append(text)
        elif paragraph:
            break
    return " ".join(paragraph).rstrip(":")


def listing(rows: list[dict], width: int) -> str:
    """A recipe per block: its name, then its summary wrapped to `width` columns under it."""
    wrap = partial(textwrap.fill, width=width, initial_indent="    ", subsequent_indent="    ", break_on_hyphens=False)
    return "\n".join(f"{row['name']}\n{wrap(row['summary'])}" for row in rows)


@recipes_app.command("list")
def list_recipes(as_json: JsonOpt = False):
    """Shipped recipes: name (what `duocal calibrate NAME` takes), what it does, its file."""
    from duocal.calibrate.recipe import shipped_recipes

    rows = [{"name": name, "summary": summary(path), "path": str(path)} for name, path in shipped_recipes().items()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    typer.echo(listing(rows, width=min(shutil.get_terminal_size().columns, 100)))


@recipes_app.command("copy")
def copy_command(
    name: Annotated[str, typer.Argument(help="A shipped recipe (duocal recipes list).")],
    folder: Annotated[Path, typer.Argument(help="Folder to copy it into (made if missing).")],
    force: Annotated[bool, typer.Option("--force", help="Replace files that are already there.")] = False,
):
    """Copy recipe NAME (and the DeepSpeed config it names) into FOLDER, ready to edit and run:
    duocal calibrate FOLDER/NAME.yaml --output runs/mine

    Example: duocal recipes copy calibrate_smollm2_135m my-recipes
    """
    from duocal.calibrate.recipe import copy_recipe as copy
    from duocal_runtime.files.output_paths import check_output_folder

    with user_errors():
        check_output_folder(folder, "FOLDER")
        written = copy(name, folder, force=force)
    for path in written:
        typer.echo(str(path))

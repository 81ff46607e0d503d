"""`duocal recipes ...`: the calibration recipes duocal ships (package data), and copying one out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .options import JsonOpt
from .user_errors import user_errors

recipes_app = typer.Typer(help="List the shipped calibration recipes, or copy one out to edit.", no_args_is_help=True)


def summary(path: Path) -> str:
    """The first line of a recipe's header comment."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") and line.strip("# "):
            return line.strip("# ").rstrip(":")
    return ""


@recipes_app.command("list")
def list_recipes(as_json: JsonOpt = False):
    """Shipped recipes: name (what `duocal calibrate NAME` takes), what it does, its file."""
    from duocal.calibrate.recipe import shipped_recipes

    rows = [{"name": name, "summary": summary(path), "path": str(path)} for name, path in shipped_recipes().items()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        typer.echo(f"{row['name']:<32} {row['summary']}")


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

    with user_errors():
        written = copy(name, folder, force=force)
    for path in written:
        typer.echo(str(path))

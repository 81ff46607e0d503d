"""The `duocal` command line (typer). Each command parses, calls one library function, prints."""

from .app import app

__all__ = ["app"]

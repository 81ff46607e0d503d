"""The `duocal` command line (typer). Each command parses, calls one library function, prints.
The console script is `duocal.__main__:main` (Ctrl-C at any point, imports included, is one line)."""

from .app import app

__all__ = ["app"]

"""Turn library errors into one clear line on stderr and a non-zero exit code."""

from __future__ import annotations

import contextlib

import typer


@contextlib.contextmanager
def user_errors():
    """Report `ValueError`s (ProfileError, PlanError, ...) as `error: ...` and exit 1."""
    try:
        yield
    except (ValueError, FileNotFoundError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None

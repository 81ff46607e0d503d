"""Turn library errors into one clear line on stderr and a non-zero exit code."""

from __future__ import annotations

import contextlib

import typer

from duocal_runtime.errors import ConflictingArgumentsError  # torch-free


def describe(err: Exception) -> str:
    """One line for the user: an OSError names its file and what went wrong, without the errno;
    arguments that exclude each other are named as the options the user typed."""
    if isinstance(err, OSError) and err.strerror and err.filename:
        return f"{err.filename}: {err.strerror[0].lower() + err.strerror[1:]}"
    if isinstance(err, ConflictingArgumentsError):
        options = [f"--{name.replace('_', '-')}" for name in err.names]
        return f"give {' or '.join(options)}, not {'both' if len(options) == 2 else 'several'}"
    return str(err)


@contextlib.contextmanager
def user_errors():
    """Report `ValueError`s (ProfileError, PlanError, ...) and file-system errors as `error: ...`, exit 1."""
    try:
        yield
    except (ValueError, OSError) as err:
        typer.echo(f"error: {describe(err)}", err=True)
        raise typer.Exit(1) from None

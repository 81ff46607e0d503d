"""`duocal calibrate [RECIPE] [key=value ...] --output DIR [--nproc N] [--resume]`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .user_errors import user_errors

CALIBRATE_EPILOG = """Examples:

  duocal calibrate --output runs/demo                       # the demo recipe on the bundled demo model

  duocal calibrate calibrate_demo train.steps=100 --output runs/short

  duocal calibrate recipes/calibrate_llama3_8b.yaml data.haystack=booksum.jsonl --output runs/llama3 --nproc 8

  duocal calibrate --output runs/demo --resume               # continue a killed run
"""


def calibrate_command(
    args: Annotated[
        list[str] | None,
        typer.Argument(
            help="RECIPE (a YAML file or shipped recipe name; default: calibrate_demo), then key=value overrides.",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        Path,
        typer.Option(
            "--output", "-o", help="Run folder: profile.json, gates.png, metrics.jsonl, config.yaml, checkpoints/."
        ),
    ] = ...,
    nproc: Annotated[int, typer.Option(help="Processes (1: in this process; N: torchrun workers).")] = 1,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the run in --output from its last checkpoint.")
    ] = False,
    launcher: Annotated[str, typer.Option(help="torchrun or deepspeed (for --nproc > 1).")] = "torchrun",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check the recipe and write config.yaml only.")] = False,
):
    """Calibrate DuoAttention gates on synthetic passkey data and write a profile (DIR/profile.json)."""
    from duocal_runtime.files.output_paths import check_output_folder

    with user_errors():
        check_output_folder(output, "--output")  # before the imports (seconds) and any work
    from duocal.calibrate.launch import checked_recipe, launch, prepare
    from duocal_runtime.files.file_lock import exclusive

    args = list(args or [])
    recipe = args.pop(0) if args and "=" not in args[0] else None
    with user_errors():
        checked_recipe(recipe, args, output, nproc, resume)  # a bad recipe makes no folder
        with exclusive(output, "duocal calibrate"):  # a second run into the same folder is refused
            if dry_run:
                prepare(recipe, args, output, nproc, resume)
                typer.echo(f"checked; resolved config written to {output / 'config.yaml'}")
                return
            path = launch(recipe, args, output, nproc, resume, launcher)
    typer.echo(f"profile written to {path}")

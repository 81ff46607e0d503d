"""Start a calibration: check everything, write the resolved config, run in-process or under torchrun.

`--nproc 1` runs in the calling process (DeepSpeed with a one-process gloo group). `--nproc N`
starts N workers with torchrun (`launcher="torchrun"`) or the DeepSpeed launcher
(`launcher="deepspeed"`), each running `python -m duocal.calibrate.run DIR/config.yaml`.
Multi-node runs use DeepSpeed's own launcher and hostfile directly:

    deepspeed --hostfile hostfile --module duocal.calibrate.run DIR/config.yaml --output DIR

after writing DIR/config.yaml with `duocal calibrate ... --output DIR --dry-run`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from duocal.calibrate.checkpoint import latest
from duocal.calibrate.engine import free_port
from duocal.calibrate.model import check_recipe
from duocal.calibrate.recipe import Recipe, load_recipe, load_resolved, save_resolved
from duocal.calibrate.run import calibrate

LAUNCHERS = ("torchrun", "deepspeed")
CONFIG = "config.yaml"


def _comparable(recipe: Recipe) -> dict:
    data = recipe.to_dict()
    data.pop("source", None)
    return data


def prepare(
    recipe_arg: str | None, overrides: list[str], output: str | Path, nproc: int = 1, resume: bool = False
) -> Recipe:
    """Resolve and validate the recipe, check `output`, write `output/config.yaml`. No training yet."""
    recipe = checked_recipe(recipe_arg, overrides, output, nproc, resume)
    save_resolved(recipe, Path(output) / CONFIG, extra={"nproc": nproc})
    return recipe


def checked_recipe(
    recipe_arg: str | None, overrides: list[str], output: str | Path, nproc: int = 1, resume: bool = False
) -> Recipe:
    """The resolved recipe, every check done (recipe, `output`'s run, --resume, --nproc); writes nothing."""
    output = Path(output)
    saved = output / CONFIG
    if nproc < 1:
        raise ValueError(f"--nproc must be at least 1, got {nproc}")
    if resume:
        if not saved.is_file():
            raise ValueError(f"nothing to resume in {output}: it has no {CONFIG}; start a run there without --resume")
        before = load_resolved(saved)
        recipe = before if recipe_arg is None and not overrides else load_recipe(recipe_arg, overrides)
        if _comparable(recipe) != _comparable(before):
            raise ValueError(
                f"--resume needs the recipe of the run in {output}; it differs (see {saved}). "
                "Resume without a recipe to use the saved one"
            )
        recipe.source = before.source
        latest(output)  # a damaged latest.json is reported now, not after the model loads
        ran_with = _saved_nproc(saved)
        if ran_with is not None and ran_with != nproc:
            raise ValueError(
                f"the run in {output} used --nproc {ran_with}; resume it with the same number of processes"
            )
    else:
        recipe = load_recipe(recipe_arg, overrides)
        if latest(output) is not None or (output / "profile.json").exists():
            raise ValueError(
                f"{output} already holds a calibration run; pass --resume to continue it, or choose another --output"
            )
    check_recipe(recipe, nproc)
    return recipe


def _saved_nproc(path: Path) -> int | None:
    import yaml

    return (yaml.safe_load(path.read_text()) or {}).get("run", {}).get("nproc")


def worker_command(output: Path, nproc: int, resume: bool, launcher: str) -> list[str]:
    target = ["duocal.calibrate.run", str(output / CONFIG), "--output", str(output)] + (["--resume"] if resume else [])
    port = str(free_port())
    if launcher == "torchrun":
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(nproc),
            "--master_port",
            port,
            "-m",
            *target,
        ]
    if launcher == "deepspeed":
        return [
            sys.executable,
            "-m",
            "deepspeed.launcher.runner",
            "--num_gpus",
            str(nproc),
            "--master_port",
            port,
            "--module",
            *target,
        ]
    raise ValueError(f"unknown launcher {launcher!r}; choose one of {', '.join(LAUNCHERS)}")


def launch(
    recipe_arg: str | None,
    overrides: list[str],
    output: str | Path,
    nproc: int = 1,
    resume: bool = False,
    launcher: str = "torchrun",
) -> Path:
    """Calibrate; returns the path of the profile written (`output/profile.json`)."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}; choose one of {', '.join(LAUNCHERS)}")
    output = Path(output)
    recipe = prepare(recipe_arg, overrides, output, nproc, resume)
    if nproc == 1:
        calibrate(recipe, output, resume)
    else:
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")  # the deepspeed launcher does not set it (25x slower on 2 cores)
        done = subprocess.run(worker_command(output, nproc, resume, launcher), env=env)
        if done.returncode != 0:
            raise RuntimeError(f"calibration workers failed (exit code {done.returncode}); see the output above")
    return output / "profile.json"

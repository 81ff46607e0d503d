"""Checkpoints of a calibration run: written atomically, resumed to the same final gates.

Layout under `DIR/checkpoints/`: one DeepSpeed checkpoint per tag (`step_000050/`: the gates and
the optimiser state, partitioned as the ZeRO stage keeps them; frozen weights are excluded), and
`latest.json`, replaced atomically only after every rank has finished writing its part. A run
killed while saving leaves a partial tag that `latest.json` never points to. Data and learning
rate are functions of the step, so (gates, AdamW moments, step) is the whole training state.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from duocal_runtime.files.atomic import write_atomic

LATEST = "latest.json"


def checkpoint_dir(output: Path) -> Path:
    return Path(output) / "checkpoints"


def latest(output: Path) -> dict | None:
    """{"tag": ..., "step": ...} of the last complete checkpoint, or None. A damaged `latest.json`
    (not JSON, not that object, naming a tag that is not there) is a `ValueError` saying what to do."""
    path = checkpoint_dir(output) / LATEST
    if not path.is_file():
        return None
    damaged = f"{path} is damaged"
    advice = "delete the checkpoints folder to restart the run from step 0, or start a new run with another --output"
    try:
        info = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise ValueError(f"{damaged} (not JSON); {advice}") from None
    if (
        not isinstance(info, dict)
        or not isinstance(info.get("tag"), str)
        or isinstance(info.get("step"), bool)
        or not isinstance(info.get("step"), int)
        or info["step"] < 0
    ):
        raise ValueError(f'{damaged} (expected {{"tag": ..., "step": N}}); {advice}')
    if "/" in info["tag"] or not (checkpoint_dir(output) / info["tag"]).is_dir():
        raise ValueError(
            f"{damaged}: it names checkpoint {info['tag']!r}, which is not in {checkpoint_dir(output)}; {advice}"
        )
    return info


def save(engine, output: Path, step: int, keep: int = 1) -> None:
    """Save after `step` steps (collective: every rank calls it)."""
    import torch.distributed as dist

    root = checkpoint_dir(output)
    tag = f"step_{step:06d}"
    engine.save_checkpoint(
        str(root), tag=tag, client_state={"step": step}, save_latest=False, exclude_frozen_parameters=True
    )
    dist.barrier()
    if dist.get_rank() == 0:
        write_atomic(root / LATEST, json.dumps({"tag": tag, "step": step}) + "\n")
        tags = sorted(p for p in root.glob("step_*") if p.is_dir())
        for old in tags[:-keep] if keep else []:
            if old.name != tag:
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def load(engine, output: Path) -> int:
    """Restore the last complete checkpoint into `engine`; returns the steps already done (0 if none)."""
    info = latest(output)
    if info is None:
        return 0
    try:
        path, state = engine.load_checkpoint(
            str(checkpoint_dir(output)),
            tag=info["tag"],
            load_module_strict=False,
            load_optimizer_states=True,
            load_lr_scheduler_states=False,
        )
    except (RuntimeError, OSError, EOFError, KeyError, ValueError) as err:  # truncated or foreign .pt files
        raise ValueError(
            f"checkpoint {info['tag']} in {checkpoint_dir(output)} is damaged ({type(err).__name__}: "
            f"{str(err)[:120]}); delete that checkpoint folder and latest.json to restart"
        ) from None
    if path is None or not isinstance(state, dict) or "step" not in state:
        raise ValueError(f"checkpoint {info['tag']} in {checkpoint_dir(output)} could not be loaded")
    return int(state["step"])

"""What a calibration run leaves behind: the profile, the heatmap, the resolved config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import duocal_runtime as dr
from duocal.calibrate.model import model_name
from duocal.calibrate.recipe import RECIPES_DIR, Recipe
from duocal.reports.plots import scores_heatmap


@dataclass(frozen=True)
class CalibrationResult:
    """What a run found: raw gates [L, G], the ranked scores, how they were ranked, the last step's
    metrics, the seconds it took and on how many processes."""

    raw_gates: torch.Tensor
    scores: list[list[float]]
    ranking: dict[str, Any]
    final: dict[str, Any]
    seconds: float
    world: int = 1


def make_profile(recipe: Recipe, name: str, config, result: CalibrationResult) -> dr.Profile:
    raw_gates, ranking, final = result.raw_gates, result.ranking, result.final
    shape = dr.shape_of_config(config)
    architectures = getattr(config, "architectures", None) or [None]
    info = dr.ModelInfo(shape, name, recipe.model.revision, architectures[0])
    source = {
        "kind": "calibration",
        "method": "DuoAttention gates (arXiv 2410.10819), duocal calibrate",
        "gates": [[round(float(g), 6) for g in row] for row in raw_gates.tolist()],
        "ranking": ranking,
        "final": {k: final.get(k) for k in ("step", "distill_loss", "reg_loss", "lr")},
        "seconds": round(result.seconds, 1),
        "processes": result.world,
        "recipe": portable(recipe),
    }
    a, d = recipe.attention, recipe.deploy
    deploy = dr.DeployDefaults.of(dr.SinkWindow(d.sink or a.sink, d.recent or a.recent), sparsity=d.sparsity)
    return dr.Profile(info, result.scores, source, deploy)


def portable(recipe: Recipe) -> dict[str, Any]:
    """The recipe for the profile's record: no machine-specific absolute paths of shipped files."""
    data = recipe.to_dict()
    data.pop("source", None)
    config = data["deepspeed"].get("config")
    if config and Path(config).is_relative_to(RECIPES_DIR):
        data["deepspeed"]["config"] = str(Path("recipes") / Path(config).relative_to(RECIPES_DIR))
    return data


def heatmap(profile: dr.Profile, path: Path, title: str) -> Path:
    return scores_heatmap(profile, path, title=title, label="score (gate)")


def write_outputs(recipe: Recipe, output: Path, config, result: CalibrationResult) -> Path:
    profile = make_profile(recipe, model_name(recipe), config, result)
    final = result.final
    path = dr.save_profile(profile, output / "profile.json")
    heatmap(
        profile, output / "gates.png", f"{profile.model.name_or_path}: calibrated gates ({final.get('step')} steps)"
    )
    return path

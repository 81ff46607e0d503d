"""Every shipped calibration recipe loads, validates and says how to run it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from duocal.calibrate.engine import deepspeed_config
from duocal.calibrate.recipe import RECIPES_DIR, load_recipe, recipe_from_dict
from duocal.data import FORMATS

RECIPES = sorted(RECIPES_DIR.glob("calibrate_*.yaml"))
FAMILY_RECIPES = {
    "calibrate_llama3_8b",
    "calibrate_llama31_8b",
    "calibrate_mistral_7b_v03",
    "calibrate_qwen25_7b",
    "calibrate_qwen3_8b",
}


def test_every_family_has_a_recipe():
    assert {p.stem for p in RECIPES} >= FAMILY_RECIPES | {"calibrate_demo"}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_loads_and_validates(path: Path):
    recipe = load_recipe(path)
    header = path.read_text().split("\nmodel:")[0]
    assert "duocal calibrate" in header and header.startswith("#")
    assert recipe.data.format in FORMATS
    if recipe.deepspeed.config:
        config = deepspeed_config(recipe.deepspeed, recipe.train.micro_batch_size, 1, 1, recipe.model.dtype, 1024)
        assert json.loads(Path(recipe.deepspeed.config).read_text())  # the file exists and parses
        assert config["zero_optimization"]["stage"] == recipe.deepspeed.zero_stage
        assert "optimizer" not in config and "bf16" not in config
    if path.stem in FAMILY_RECIPES:  # upstream's settings
        t, a, d = recipe.train, recipe.attention, recipe.data
        assert (t.steps, t.lr, t.reg, t.init, t.warmup, t.decay, t.min_lr_ratio) == (
            2000,
            0.02,
            0.05,
            1.0,
            0.2,
            0.2,
            0.1,
        )
        assert (a.sink, a.recent, tuple(d.context), d.num_passkeys) == (128, 256, (1000, 32000), 10)
        assert recipe.deepspeed.zero_stage == 3 and recipe.deepspeed.sequence_parallel > 1


def test_demo_recipe_is_the_default_and_fits_the_demo_model():
    from duocal.calibrate.model import check_recipe

    recipe = load_recipe(None)
    assert Path(recipe.source).name == "calibrate_demo.yaml" and recipe.model.name_or_path == "demo"
    checked = check_recipe(recipe)
    assert checked.config.model_type == "llama"


def test_overrides_and_unknown_keys():
    recipe = load_recipe(None, ["train.steps=7", "data.context=[300,400]", "deepspeed.zero_stage=2"])
    assert (recipe.train.steps, recipe.data.context, recipe.deepspeed.zero_stage) == (7, [300, 400], 2)
    with pytest.raises(ValueError, match=r"unknown recipe key attention.window; section attention has: sink, recent"):
        load_recipe(None, ["attention.window=3"])
    with pytest.raises(ValueError, match="is not key=value"):
        load_recipe(None, ["train.steps"])
    with pytest.raises(ValueError, match=r"data.depth: Input should be less than or equal to 1"):
        recipe_from_dict({"data": {"depth": [0.5, 1.5]}})


def test_code_defaults_are_the_demo_recipe():
    """An installed wheel has no recipes/ folder: `duocal calibrate` then runs on these defaults."""
    from duocal.calibrate.recipe import Recipe

    shipped = load_recipe(None).to_dict()
    defaults = Recipe().to_dict()
    for data in (shipped, defaults):
        data.pop("source")
        data["deepspeed"].pop("config")  # recipes/deepspeed/cpu.json only restates DeepSpeed's defaults
    assert shipped == defaults

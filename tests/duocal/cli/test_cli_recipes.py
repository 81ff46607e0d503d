"""`duocal recipes list | copy`."""

import json

import yaml
from typer.testing import CliRunner

from duocal.calibrate.recipe import load_recipe, shipped_recipes
from duocal.cli import app

runner = CliRunner()


def test_list_names_every_shipped_recipe_with_its_header():
    result = runner.invoke(app, ["recipes", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["name"] for r in rows] == list(shipped_recipes())
    assert {"calibrate_demo", "calibrate_smollm2_135m", "demo_model"} <= {r["name"] for r in rows}
    assert all(r["summary"] for r in rows)


def test_copy_writes_the_recipe_and_its_deepspeed_config_and_refuses_to_overwrite(tmp_path):
    result = runner.invoke(app, ["recipes", "copy", "calibrate_demo", str(tmp_path / "mine")])
    assert result.exit_code == 0, result.output
    recipe = tmp_path / "mine" / "calibrate_demo.yaml"
    config = tmp_path / "mine" / "deepspeed" / "cpu.json"
    assert result.stdout.split() == [str(recipe), str(config)]
    assert yaml.safe_load(recipe.read_text()) == yaml.safe_load(shipped_recipes()["calibrate_demo"].read_text())
    assert load_recipe(str(recipe)).deepspeed.config == str(config.resolve())  # the copy runs as it is
    recipe.write_text("# edited\n")
    again = runner.invoke(app, ["recipes", "copy", "calibrate_demo", str(tmp_path / "mine")])
    assert again.exit_code == 1 and "already exists; pass --force" in again.stderr
    assert recipe.read_text() == "# edited\n"
    forced = runner.invoke(app, ["recipes", "copy", "calibrate_demo", str(tmp_path / "mine"), "--force"])
    assert forced.exit_code == 0 and recipe.read_text() != "# edited\n"
    unknown = runner.invoke(app, ["recipes", "copy", "calibrate_nope", str(tmp_path)])
    assert unknown.exit_code == 1 and "no shipped recipe 'calibrate_nope'" in unknown.stderr


def test_list_reads_whole_at_80_columns_in_a_pipe():
    result = runner.invoke(app, ["recipes", "list"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 80, [line for line in lines if len(line) > 80]
    assert [line for line in lines if not line.startswith(" ")] == list(shipped_recipes())
    words = " ".join(result.stdout.split())
    # the whole first paragraph of each header, not its first line cut off
    assert "sink 128 / recent 256, one 32k sample per step split over 8 GPUs by sequence parallelism)" in words
    assert "(mit-han-lab/duo-attention scripts/train.sh: 2000 steps" in words
    assert "(shipped as profiles/smollm2-135m-instruct.json)" in words

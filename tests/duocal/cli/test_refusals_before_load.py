"""Arguments that the model's config alone can refuse are refused before its weights load (they took
8.8 s and 38 s): a bad sparsity, a missing profile, a profile of another model, for every command that
loads a model. The loader is made to fail the test if it is ever called (issue 38)."""

import pytest
from typer.testing import CliRunner

from duocal.cli.app import app
from duocal.models import resolve

from helpers.paths import REPO

OTHER_MODELS_PROFILE = str(REPO / "profiles" / "smollm2-135m-instruct.json")  # the commands run the demo model
ANOTHER_MODEL = "profile is for 30 layers x 3 KV heads"
NO_PROFILE = "no profile at"

CASES = {
    "passkey, profile of another model": (["eval", "passkey", "--profile", OTHER_MODELS_PROFILE], ANOTHER_MODEL),
    "passkey, missing profile": (["eval", "passkey", "--profile", "/no/such/profile.json"], NO_PROFILE),
    "passkey, sparsity 1.5": (["eval", "passkey", "--sparsity", "1.5"], "sparsity must be in [0, 1]"),
    "ppl, profile of another model": (["eval", "ppl", "--profile", OTHER_MODELS_PROFILE], ANOTHER_MODEL),
    "ppl, missing profile": (["eval", "ppl", "--profile", "/no/such/profile.json"], NO_PROFILE),
    "ppl, sparsity -0.1": (["eval", "ppl", "--sparsity", "-0.1"], "sparsity must be in [0, 1]"),
    "ruler, profile of another model": (["eval", "ruler", "--profile", OTHER_MODELS_PROFILE], ANOTHER_MODEL),
    "profile, scores from another model": (
        ["profile", "--scores-from", OTHER_MODELS_PROFILE, "--output", "{tmp}/out.json"],
        ANOTHER_MODEL,
    ),
    "profile, missing scores": (
        ["profile", "--scores-from", "/no/such/profile.json", "--output", "{tmp}/out.json"],
        NO_PROFILE,
    ),
    "profile, loss at sparsity 1": (
        ["profile", "--score", "loss", "--loss-at-sparsity", "1", "--output", "{tmp}/out.json"],
        "--loss-at-sparsity must be between 0 and 1 (exclusive), got 1.0",
    ),
    "profile, loss at sparsity with another score": (
        ["profile", "--score", "kept", "--loss-at-sparsity", "0.75", "--output", "{tmp}/out.json"],
        "--loss-at-sparsity ranks heads by the loss score; the score here is kept",
    ),
    "profile, loss at sparsity with --scores-from": (
        ["profile", "--scores-from", OTHER_MODELS_PROFILE, "--loss-at-sparsity", "0.75", "--output", "{tmp}/out.json"],
        "--loss-at-sparsity and --nested rank the heads, --scores-from keeps another profile's ranking",
    ),
    "profile, nested with --scores-from": (
        ["profile", "--scores-from", OTHER_MODELS_PROFILE, "--nested", "--output", "{tmp}/out.json"],
        "--loss-at-sparsity and --nested rank the heads, --scores-from keeps another profile's ranking",
    ),
    "profile, nested with another score": (
        ["profile", "--score", "kept", "--nested", "--output", "{tmp}/out.json"],
        "--nested orders heads by the loss score at each plan",
    ),
    "profile, nested with loss at sparsity": (
        ["profile", "--score", "loss", "--nested", "--loss-at-sparsity", "0.75", "--output", "{tmp}/out.json"],
        "--nested orders heads by the loss score at each plan",
    ),
    "serve, profile of another model": (["serve", "--profile", OTHER_MODELS_PROFILE, "--port", "0"], ANOTHER_MODEL),
    "serve, missing profile": (["serve", "--profile", "/no/such/profile.json", "--port", "0"], NO_PROFILE),
    "serve, sparsity 1.5": (["serve", "--sparsity", "1.5", "--port", "0"], "sparsity must be in [0, 1]"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_from_the_config_before_the_weights_load(case, tmp_path, monkeypatch):
    def never(self):
        raise AssertionError(f"the weights of {self.arg} were loaded before the arguments were checked")

    monkeypatch.setattr(resolve.ModelRef, "load_model", never)
    args, message = CASES[case]
    result = CliRunner().invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert not isinstance(result.exception, AssertionError), result.exception
    assert result.exit_code == 1, result.output
    assert "error: " in result.output and message in result.output, result.output
    assert not (tmp_path / "out.json").exists()

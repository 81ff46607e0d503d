"""`duocal --help`: one line per command (the whole text is each command's own --help), and no claim the server no
longer holds."""

import re

from typer.testing import CliRunner

from duocal.cli.app import app

runner = CliRunner(env={"COLUMNS": "120", "TERM": "dumb"})


def command_rows(text: str) -> list[str]:
    section = text.split("Commands", 1)[1]
    return [line for line in section.splitlines() if line.startswith("│")]


def test_each_command_is_one_line_in_the_top_level_help():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    rows = command_rows(result.output)
    names = [re.match(r"│ (\S+)", row).group(1) for row in rows]
    assert names == ["calibrate", "profile", "tune", "chat", "serve", "profiles", "eval", "models", "recipes"]


def test_serve_help_says_sampling_settings_are_honoured():
    text = " ".join(runner.invoke(app, ["serve", "--help"]).output.split())
    assert "sampling settings are honoured per request" in text
    assert "sampling settings other than the model's" not in text

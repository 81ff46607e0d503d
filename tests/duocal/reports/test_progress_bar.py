"""Calibration's and evaluation's bars are one bar (duocal/reports/progress_bar.py) with their own fields."""

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from duocal.calibrate.run import calibration_progress
from duocal.cli.progress import eval_progress


def kinds(bar) -> list[str]:
    return [
        f"text:{c.text_format}" if isinstance(c, TextColumn) else type(c).__name__
        for c in bar.columns
        if isinstance(c, (TextColumn, BarColumn, MofNCompleteColumn, TimeElapsedColumn, TimeRemainingColumn))
    ]


def test_calibration_and_evaluation_show_the_same_bar_with_their_fields(capsys, monkeypatch):
    tail = ["TimeElapsedColumn", "text:ETA", "TimeRemainingColumn"]
    calibration = calibration_progress(active=False)
    assert kinds(calibration) == [
        "text:calibrate",
        "BarColumn",
        "MofNCompleteColumn",
        "text:{task.fields[losses]}",
        *tail,
    ]
    assert calibration.disable
    monkeypatch.setattr("rich.console.Console.is_terminal", property(lambda console: True))  # a bar, not lines
    with eval_progress("ppl") as progress:
        assert kinds(progress.bar) == ["text:{task.description}", "BarColumn", "MofNCompleteColumn", *tail]
        progress(1, 2, "ppl")
        progress.row("a finished row")
    assert capsys.readouterr().out == ""  # never on stdout: --json stays clean

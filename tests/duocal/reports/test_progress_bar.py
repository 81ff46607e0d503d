"""Calibration's and evaluation's bars are one bar (duocal/reports/progress_bar.py) with their own fields."""

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from duocal.calibrate.run import calibration_bar, calibration_progress
from duocal.reports.progress import stderr_progress


def kinds(bar) -> list[str]:
    return [
        f"text:{c.text_format}" if isinstance(c, TextColumn) else type(c).__name__
        for c in bar.columns
        if isinstance(c, (TextColumn, BarColumn, MofNCompleteColumn, TimeElapsedColumn, TimeRemainingColumn))
    ]


def test_calibration_and_evaluation_show_the_same_bar_with_their_fields(capsys, monkeypatch):
    tail = ["TimeElapsedColumn", "text:ETA", "TimeRemainingColumn"]
    calibration = calibration_bar(active=False)
    assert kinds(calibration) == [
        "text:calibrate",
        "BarColumn",
        "MofNCompleteColumn",
        "text:{task.fields[losses]}",
        *tail,
    ]
    assert calibration.disable
    monkeypatch.setattr("rich.console.Console.is_terminal", property(lambda console: True))  # a bar, not lines
    with stderr_progress("ppl") as progress:
        assert kinds(progress.bar) == ["text:{task.description}", "BarColumn", "MofNCompleteColumn", *tail]
        progress(1, 2, "ppl")
        progress.row("a finished row")
    assert capsys.readouterr().out == ""  # never on stdout: --json stays clean


def test_calibration_off_a_terminal_prints_plain_lines_with_an_eta(capsys):
    with calibration_progress(True, start=0, steps=4) as report:  # pytest's stderr is not a terminal
        for step in range(1, 5):
            report(step, f"distill 0.{step}")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "calibrate: 0/4 (0%), 0:00 elapsed"
    assert lines[1].startswith("calibrate: 1/4 (25%), 0:00 elapsed, ETA ")  # the first step: the first ETA
    assert lines[-1] == "calibrate: 4/4 (100%), 0:00 elapsed"
    assert not any("━" in line or "…" in line for line in lines)


def test_other_ranks_show_nothing(capsys):
    with calibration_progress(False, start=0, steps=4) as report:
        report(1, "distill 0.1")
    assert capsys.readouterr().err == ""

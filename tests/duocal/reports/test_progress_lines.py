"""Progress on a non-terminal: plain periodic lines with done / total and an ETA (issue 38)."""

import time

from duocal.reports.progress import LineProgress, clock_text, progress_line


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lines_come_first_units_every_interval_on_a_new_task_and_at_the_end():
    clock, lines = FakeClock(), []
    progress = LineProgress("passkey", lines.append, every=15.0, clock=clock)
    progress(0, 48, "full, 2048 tokens")  # the first call: a line
    for done, at in ((8, 10.0), (16, 20.0), (24, 25.0)):
        clock.now = 100.0 + at
        progress(done, 48, "full, 2048 tokens")
    clock.now = 130.0
    progress(24, 48, "duo @ sparsity 0.5, 2048 tokens")  # a new row: a line at once
    clock.now = 160.0
    progress(48, 48, "duo @ sparsity 0.5, 2048 tokens")  # the last unit: a line
    assert lines == [
        "passkey: 0/48 (0%), 0:00 elapsed, full, 2048 tokens",
        "passkey: 8/48 (17%), 0:10 elapsed, ETA 0:50, full, 2048 tokens",  # the first units: the first ETA
        "passkey: 24/48 (50%), 0:25 elapsed, ETA 0:25, full, 2048 tokens",  # 15 s after the last line
        "passkey: 24/48 (50%), 0:30 elapsed, ETA 0:30, duo @ sparsity 0.5, 2048 tokens",
        "passkey: 48/48 (100%), 1:00 elapsed, duo @ sparsity 0.5, 2048 tokens",
    ]
    progress.row("full, 2048 tokens: exact match 1.000")
    assert lines[-1] == "full, 2048 tokens: exact match 1.000"


def test_no_line_without_a_total_and_clock_text_reads_like_rich():
    lines = []
    LineProgress("ruler", lines.append, clock=FakeClock())(0, 0, "loading")
    assert lines == []
    assert clock_text(59.6) == "1:00" and clock_text(3725) == "1:02:05"
    assert progress_line("profile", 3, 8, 30.0, "sequences measured") == (
        "profile: 3/8 (38%), 0:30 elapsed, ETA 0:50, sequences measured"
    )


def test_a_long_batch_still_gets_lines():
    clock, lines = FakeClock(), []
    progress = LineProgress("passkey", lines.append, every=15.0, clock=clock)
    progress.beat()  # nothing reported yet: nothing to say
    progress(0, 24, "full, 1280 tokens")
    clock.now += 10.0
    progress.beat()  # 10 s since the last line: quiet
    clock.now += 10.0
    progress.beat()
    assert lines == [
        "passkey: 0/24 (0%), 0:00 elapsed, full, 1280 tokens",
        "passkey: 0/24 (0%), 0:20 elapsed, full, 1280 tokens",
    ]


def test_the_timer_thread_beats_and_stops():
    lines = []
    progress = LineProgress("ppl", lines.append, every=0.01)
    with progress.beating():
        progress(0, 4, "full")
        deadline = time.monotonic() + 5.0
        while len(lines) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(lines) >= 3 and all(line.startswith("ppl: 0/4 (0%), ") for line in lines)
    count = len(lines)
    time.sleep(0.05)
    assert len(lines) == count  # stopped with the block

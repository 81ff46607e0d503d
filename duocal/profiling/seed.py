"""The profiler's default sample seed: torch-free, so that `duocal profile --help` shows it without
loading the profiler."""

PROFILER_SEED = 4242  # not among calibration's or evaluation's default seeds

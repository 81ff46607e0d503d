"""duocal: calibrate which attention heads need their whole KV cache, and serve with less.

The inference runtime is the separate, light package `duocal_runtime`; this package holds
calibration, profilers, evaluation, benchmarks and the `duocal` command line.
"""

__version__ = "0.1.0"

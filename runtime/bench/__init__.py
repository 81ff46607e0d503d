"""The runtime benchmark: `python -m duocal_runtime.bench --help` (see docs/benchmarks/runtime.md)."""

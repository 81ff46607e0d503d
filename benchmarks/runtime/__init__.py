"""The runtime benchmark: `python -m benchmarks.runtime --help` (see docs/benchmarks/runtime.md)."""

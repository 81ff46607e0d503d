"""The runtime benchmark: `python -m duocal_runtime.bench --help` (see README "Runtime benchmark")."""

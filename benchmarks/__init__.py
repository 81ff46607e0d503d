"""The workshop: benchmarks and the docs' figure tools, run from the repository root (`python -m benchmarks.runtime`,
`python benchmarks/vllm/bench_serving.py`, ...); never installed and never imported by duocal's packages."""

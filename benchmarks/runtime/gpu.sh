#!/usr/bin/env bash
# The GPU run of the runtime benchmark, in stages that each fit a 10-minute device call:
#   benchmarks/runtime/gpu.sh check     # correctness on CUDA + the decode-layout measurement (~1.5 min)
#   benchmarks/runtime/gpu.sh 32k       # dynamic, static, full, full-compiled, stream50/75, mixed50, h2o50 at 32k (~3.5 min)
#   benchmarks/runtime/gpu.sh 128k      # dynamic, stream50/75, then static, stream50/75 and mixed50/75 compiled (~5 min)
#   benchmarks/runtime/gpu.sh           # all three
#   benchmarks/runtime/gpu.sh serve     # serving: plain continuous batching vs duo 50% / 75%, 16 requests of 16k-32k
#                                  # tokens, random weights and scores, pool = 4 plain requests (not run yet)
# Results go to ${OUT:-out/gpu}. The device machine has torch 2.11 and an older transformers; bring
# transformers 5.24 as a wheel (here, before the run), for the device's Python 3.12:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d wheels transformers==5.24.0
# PYTHON names the interpreter that holds CUDA torch (default: python3; the device image has no `python`).
set -euo pipefail
cd "$(dirname "$0")/../.."
stage=${1:-all}
case "$stage" in check|32k|128k|all|serve) ;; *) echo "unknown stage '$stage': give check, 32k, 128k, serve or nothing (all but serve)" >&2; exit 2;; esac
OUT=${OUT:-out/gpu}
mkdir -p "$OUT" /tmp/duocal-pkgs
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
if [ -d wheels ]; then "$PYTHON" -m pip install -q --no-deps wheels/transformers-*.whl; fi
ln -sfn "$PWD/runtime" /tmp/duocal-pkgs/duocal_runtime   # the runtime package without installing the project
export PYTHONPATH=/tmp/duocal-pkgs${PYTHONPATH:+:$PYTHONPATH}
BENCH="$PYTHON -m benchmarks.runtime --device cuda --dtype bfloat16 --shape llama3-8b --max-prefill 131072 --steps 32"
"$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
if [ "$stage" = check ] || [ "$stage" = all ]; then
  "$PYTHON" -m benchmarks.runtime.gpu_check 2>&1 | tee "$OUT/gpu_check.txt"
fi
if [ "$stage" = 32k ] || [ "$stage" = all ]; then
  $BENCH --contexts 32768 --rows dynamic,static,full,full-compiled,stream50,stream75,mixed50,h2o50 \
    --out "$OUT/bench-32k.json" 2>&1 | tee "$OUT/bench-32k.txt"
fi
if [ "$stage" = 128k ] || [ "$stage" = all ]; then
  # two runs: a compiled row that fails must not lose the eager rows (results are written at the end of a run)
  $BENCH --contexts 131072 --rows dynamic,stream50,stream75 \
    --out "$OUT/bench-128k-eager.json" 2>&1 | tee "$OUT/bench-128k-eager.txt"
  $BENCH --contexts 131072 --rows static,stream50-compiled,stream75-compiled,mixed50-compiled,mixed75-compiled \
    --out "$OUT/bench-128k-compiled.json" 2>&1 | tee "$OUT/bench-128k-compiled.txt"
fi
if [ "$stage" = serve ]; then
  "$PYTHON" -m benchmarks.runtime.serving --shape llama3-8b --device cuda --dtype bfloat16 --requests 16 \
    --prompt 16384:32768 --new 64:128 --plain-requests 4 --rows plain,duo50,duo75 \
    --out "$OUT/serving.json" 2>&1 | tee "$OUT/serving.txt"
fi

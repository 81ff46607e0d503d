#!/usr/bin/env bash
# The GPU run of issue 9, as one script (about 8 minutes on one H200, machine start excluded):
#   correctness checks, then the benchmark at 32k and 128k. Results go to ${OUT:-out/gpu}.
# The device machine has torch 2.11 and an older transformers; bring transformers 5.24 as a wheel:
#   pip download --no-deps transformers==5.24.0 -d wheels    (here, before the run)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/gpu}
mkdir -p "$OUT" /tmp/duocal-pkgs
if [ -d wheels ]; then pip install -q --no-deps wheels/transformers-*.whl; fi
ln -sfn "$PWD/runtime" /tmp/duocal-pkgs/duocal_runtime   # the runtime package without installing the project
export PYTHONPATH=/tmp/duocal-pkgs${PYTHONPATH:+:$PYTHONPATH}
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
python -m duocal_runtime.bench.gpu_check 2>&1 | tee "$OUT/gpu_check.txt"
BENCH="python -m duocal_runtime.bench --device cuda --dtype bfloat16 --shape llama3-8b --max-prefill 131072 --steps 32"
$BENCH --contexts 32768 --rows dynamic,static,full,full-compiled,stream50,stream75,h2o50 --out "$OUT/bench-32k.json" 2>&1 | tee "$OUT/bench-32k.txt"
$BENCH --contexts 131072 --rows dynamic,static,full,stream50,stream75,h2o50,stream50-compiled,stream75-compiled --out "$OUT/bench-128k.json" 2>&1 | tee "$OUT/bench-128k.txt"

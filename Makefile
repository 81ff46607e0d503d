# Two entry points (see README.md): `make demo` and `make test`. Both set up .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
export OMP_NUM_THREADS ?= 1

.PHONY: setup demo test

setup: $(VENV)/.installed

# torch is pinned through constraints.txt: an unpinned resolve downloads a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[dev]'
	touch $@

# The main job: calibrate the bundled demo model with the default recipe, then compare full
# attention, the calibrated profile at 50% streaming heads, StreamingLLM on every head and random
# head choice on held-out passkey samples. Writes out/demo/{profile.json,gates.png,passkey.png,...}.
demo: setup
	$(VENV)/bin/duocal calibrate --output out/demo
	$(VENV)/bin/duocal eval passkey --profile out/demo/profile.json --sparsity 0.5 \
		--policies full,duo,streaming,random --contexts 512,1024 --samples 40 --plot out/demo/passkey.png

test: setup
	$(PY) -m pytest -q

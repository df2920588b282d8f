# `make demo` and `make test` each set up .venv on a fresh machine, then run.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

.PHONY: install demo test test-all lint bench
install: $(STAMP)

demo: $(STAMP)
	$(BIN)/vitlab train --dataset mnist-5k

# two tiers, each one pytest pass on the two cores (pytest-xdist; tests that bind ports share the group "ports"):
# test = the fast tier (pyproject's addopts leave out the slow, gpu, notebook and full markers), every module exercised;
# test-all = what CI runs (.ci/run): the fast tier plus the full tests (end-to-end studies, kill-and-resume, Ray,
# DDP, tracker round trips, oracles at full width, packaging) and the tutorial notebook (docs/tutorial.ipynb)
XDIST := -n 2 --dist loadgroup

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/python -m pytest $(XDIST)

test-all: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/python -m pytest $(XDIST) -m 'not slow and not gpu'

bench: $(STAMP)
	$(BIN)/python benchmarks/bench.py

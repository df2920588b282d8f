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

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/python -m pytest

# what CI runs: make test, then the tutorial notebook executed top to bottom (docs/tutorial.ipynb)
test-all: test
	$(BIN)/python -m pytest -m notebook

bench: $(STAMP)
	$(BIN)/python benchmarks/bench.py

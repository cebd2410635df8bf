# The two commands: `make run` (set up, then the demo) and `make test` (set up, then every check).
# The interpreter the venv is made from: the distribution's python3.11 when there is one (an
# optimised build, on which the daemon does some 15 % more jobs per second than on a default
# pyenv build: docs/performance.md), else python3.11 on PATH. `make PYTHON=...` picks another.
PYTHON ?= $(firstword $(wildcard /usr/bin/python3.11) python3.11)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint unit fuzz bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test,bench]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/snerdmq demo

lint: $(STAMP)
	$(BIN)/ruff check snerd sim tests bench jepsen-lite
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: $(STAMP)
	$(BIN)/python -m pytest -q

test: lint unit

# A long fuzz run: every test in tests/fuzz/ with SNERD_FUZZ_EXAMPLES inputs each
# (default 20,000; docs/operations.md, "Hostile input", has the figures of one run).
fuzz: $(STAMP)
	SNERD_HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest -q -p no:cacheprovider --timeout=0 tests/fuzz/

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .snerdata .pytest_cache .mypy_cache .ruff_cache

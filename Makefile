# Two entry points, both self-contained on a fresh machine with python3:
#   make run   installs the planner (light dependencies) and runs it on the bundled dump
#   make test  installs everything the tests need (dev + the real XLA stack), lints, type-checks and runs them
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: run test lint

run: $(VENV)/.installed-core
	$(BIN)/spmd-planner parse

test: lint
	$(BIN)/python -m pytest

lint: $(VENV)/.installed-full
	$(BIN)/ruff check planner api scan_runtime tests bench
	$(BIN)/ruff format --check planner api scan_runtime tests bench
	$(BIN)/mypy

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-core: pyproject.toml $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-full: pyproject.toml $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e '.[dev,xla]'
	touch $@ $(VENV)/.installed-core

# Two entry points, both self-contained on a fresh machine with python3:
#   make run   installs the planner (light dependencies) and plans the bundled dump (verdict first)
#   make test  installs everything the tests need (dev + the real XLA stack, Debian's chromium for the
#              browser test), lints, type-checks and runs them
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

# apt-get needs root; elsewhere it goes through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test lint chromium

run: $(VENV)/.installed-core
	$(BIN)/spmd-planner plan --mesh fsdp=4,tp=2 --chip v6e
	@echo
	@echo "dashboard: $(BIN)/spmd-planner serve, then open http://127.0.0.1:8000/ and plan a dump there"

test: lint chromium
	$(BIN)/python -m pytest

lint: $(VENV)/.installed-full
	$(BIN)/ruff check planner api scan_runtime fidelity tests bench examples
	$(BIN)/ruff format --check planner api scan_runtime fidelity tests bench examples
	$(BIN)/mypy

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-core: pyproject.toml $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-full: pyproject.toml $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e '.[dev,xla,tpu]'
	touch $@ $(VENV)/.installed-core

# The dashboard's end-to-end test drives Debian's Chromium headless.
chromium:
	@command -v chromium >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; }

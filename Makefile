# Two entry points, both self-contained on a fresh machine with python3:
#   make run   installs the planner (light dependencies) and plans the bundled dump (verdict first)
#   make test  installs everything the tests need (dev + the real XLA stack, Debian's chromium for the
#              browser test), lints, type-checks and runs them
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

# apt-get needs root; elsewhere it goes through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test lint chromium postgresql native

# The compiled core (planner/native.py, built by setup.py) follows its sources: an edit not yet
# rebuilt runs as pure Python, and `make native` (which run and test call) rebuilds it.
# The list is planner/native.py's MODULES, so a module added there is followed here too.
NATIVE_SOURCES := setup.py planner/native.py $(shell grep -o '"planner/[a-z0-9_/]*\.py"' planner/native.py | tr -d '"')

run: $(VENV)/.installed-core $(VENV)/.native
	$(BIN)/spmd-planner plan --mesh fsdp=4,tp=2 --chip v6e
	@echo
	@echo "dashboard: $(BIN)/spmd-planner serve, then open http://127.0.0.1:8000/ and plan a dump there"

test: lint chromium postgresql $(VENV)/.native
	$(BIN)/python -m pytest

lint: $(VENV)/.installed-full
	$(BIN)/ruff check planner api scan_runtime fidelity tests bench examples
	$(BIN)/ruff format --check planner api scan_runtime fidelity tests bench examples
	$(BIN)/mypy

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-core: pyproject.toml setup.py $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@ $(VENV)/.native

$(VENV)/.installed-full: pyproject.toml setup.py $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e '.[dev,xla,tpu,search,team]'
	touch $@ $(VENV)/.installed-core $(VENV)/.native

native: $(VENV)/.native

$(VENV)/.native: $(NATIVE_SOURCES) | $(VENV)/.installed-core
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $@

# The dashboard's end-to-end test drives Debian's Chromium headless.
chromium:
	@command -v chromium >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; }

# The store's tests start a real PostgreSQL server from Debian's package (tests/postgres_server.py).
postgresql:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq postgresql >/dev/null; }

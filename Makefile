# Two entry points, both self-contained on a fresh machine with python3:
#   make run   installs the planner (light dependencies) and plans the bundled dump (verdict first)
#   make test  installs everything the tests need (dev + the real XLA stack, Debian's chromium for the
#              browser test), lints, type-checks and runs them; then runs the JAX tests again on today's
#              JAX (jax 0.12 and its libtpu, Python 3.12) in a second environment
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

# apt-get needs root; elsewhere it goes through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# Today's JAX (jax >= 0.11 needs Python 3.12): a second environment with the JAX extras only, so that
# the JAX side is tested on the release users run as well as on the one torch_xla 2.9 pins.
# The first Python 3.12 that runs (a pyenv shim may name one its configuration does not enable).
PYTHON_JAX ?= $(shell for p in $$(command -v python3.12) $$HOME/.pyenv/versions/3.12*/bin/python3.12; do \
	"$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { echo "$$p"; break; }; done)
JAX_TODAY ?= 0.12.0.1
VENV_JAX ?= .venv-jax
BIN_JAX := $(VENV_JAX)/bin
JAX_TODAY_TESTS := tests/test_jax_today.py tests/test_chip_capacity.py tests/test_grid_today.py tests/test_stablehlo_text.py tests/test_stablehlo_releases.py \
	tests/test_parser_today.py tests/test_shardy_real_steps.py tests/test_shardy_compile.py tests/test_shardy_cases_jax012.py \
	tests/test_verify_releases.py tests/test_shardy_rules_jax012.py tests/test_shardy_rule_releases.py tests/test_shardy_import_passes.py \
	tests/test_shardy_rules_every_op.py tests/test_tpu_call_inliner.py tests/test_host_offload.py

.PHONY: run test test-jax-today lint chromium postgresql native

# The compiled core (planner/native.py, built by setup.py) follows its sources: an edit not yet
# rebuilt runs as pure Python, and `make native` (which run and test call) rebuilds it.
# The list is planner/native.py's MODULES, so a module added there is followed here too.
NATIVE_SOURCES := setup.py planner/native.py $(shell grep -o '"planner/[a-z0-9_/]*\.py"' planner/native.py | tr -d '"')

run: $(VENV)/.installed-core $(VENV)/.native
	$(BIN)/spmd-planner plan --mesh fsdp=4,tp=2 --chip v6e
	@echo
	@echo "dashboard: $(BIN)/spmd-planner serve, then open http://127.0.0.1:8000/ and plan a dump there"

# The suite on one worker per core (pytest-xdist): most tests wait on a compiler, a server or Ray in a
# child process, so two workers fill two cores where one leaves them half idle.
TEST_WORKERS ?= $(shell nproc 2>/dev/null || echo 2)

# The jax $(JAX_TODAY) environment is made and tested beside the main suite (its output kept in a file
# and printed after it): both wait on compilers more than they compute. Either one failing fails the run.
test: lint chromium postgresql $(VENV)/.native
	@rm -f $(VENV_JAX).log; $(MAKE) --no-print-directory test-jax-today > $(VENV_JAX).log 2>&1 & today=$$!; \
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal; main=$$?; \
	wait $$today; jax=$$?; echo; echo "make test: the tests on jax $(JAX_TODAY) ($(VENV_JAX).log):"; \
	cat $(VENV_JAX).log; [ $$main -eq 0 ] && [ $$jax -eq 0 ]

# The JAX extras installed over jax $(JAX_TODAY) must leave it there (tests/test_jax_today.py checks).
test-jax-today:
	@if [ -z "$(PYTHON_JAX)" ]; then \
		echo "make test: no Python 3.12 on this machine: the tests on jax $(JAX_TODAY) did not run" >&2; exit 1; fi
	$(MAKE) $(VENV_JAX)/.installed
	JAX_TODAY=$(JAX_TODAY) $(BIN_JAX)/python -m pytest $(JAX_TODAY_TESTS)

$(VENV_JAX)/.installed: pyproject.toml setup.py
	$(PYTHON_JAX) -m venv $(VENV_JAX)
	$(BIN_JAX)/python -m pip install --quiet --upgrade pip
	$(BIN_JAX)/python -m pip install --quiet 'jax[tpu]==$(JAX_TODAY)'
	# Pure Python: its tests are the text forms and compiles of today's JAX, not the core's speed, and
	# mypyc's build for a second interpreter would take CI minutes. A compiled core left from an earlier
	# build for this interpreter would shadow the sources without its runtime module: it goes first.
	find planner -name '*.cpython-312-*.so' -delete
	SPMD_PLANNER_PURE=1 $(BIN_JAX)/python -m pip install --quiet -e '.[dev,jax,tpu,team]'
	touch $@

# MaxText, for making its train steps into references (`fidelity.run_maxtext`; not a test dependency: the
# steps are checked in under tests/fixtures/maxtext). Its TPU extra pins about 235 packages; train_compile
# needs these, at the versions its steps were made with, over today's jax.
MAXTEXT ?= 0.2.5
# The jax and libtpu its steps are compiled by: today's jax and the libtpu its `jax[tpu]` pins by default.
# Another pair gets its own environment, so that each libtpu's steps can be made beside the others':
# `make maxtext-env JAX_MAXTEXT=0.12.1 LIBTPU_MAXTEXT=0.0.52` (jax 0.12.1 pins a libtpu not yet published).
JAX_MAXTEXT ?= $(JAX_TODAY)
LIBTPU_MAXTEXT ?=
JAX_MAXTEXT_PINS := $(if $(LIBTPU_MAXTEXT),jax==$(JAX_MAXTEXT) jaxlib==$(JAX_MAXTEXT) libtpu==$(LIBTPU_MAXTEXT) requests,'jax[tpu]==$(JAX_MAXTEXT)')
VENV_MAXTEXT ?= .venv-maxtext$(if $(LIBTPU_MAXTEXT)$(filter-out $(JAX_TODAY),$(JAX_MAXTEXT)),-$(JAX_MAXTEXT)$(if $(LIBTPU_MAXTEXT),-libtpu-$(LIBTPU_MAXTEXT)))
MAXTEXT_DEPS := absl-py==2.5.1 aqtp==0.9.0 asgiref==3.13.0 drjax==0.2.1 einops==0.8.2 flax==0.12.12 \
	gcsfs==2026.10.1 grain==0.2.18 grpcio-status==1.85.3 jaxtyping==0.3.11 Jinja2==3.1.6 ml_collections==1.1.0 \
	omegaconf==2.4.0 optax==0.2.8 orbax-checkpoint==0.12.8 pathwaysutils==0.1.13 pillow==13.0.0 pydantic==2.14.4 \
	PySocks==1.7.1 qwix==0.1.8 sentencepiece==0.2.3 sympy==1.14.0 tensorboardX==2.6.5 tiktoken==0.14.0 \
	tokamax==0.0.17 transformers==5.24.0 zipp==4.1.2

.PHONY: maxtext-env
maxtext-env: $(VENV_MAXTEXT)/.installed

$(VENV_MAXTEXT)/.installed:
	@if [ -z "$(PYTHON_JAX)" ]; then echo "maxtext-env: MaxText needs Python 3.12, not found" >&2; exit 1; fi
	$(PYTHON_JAX) -m venv $(VENV_MAXTEXT)
	$(VENV_MAXTEXT)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_MAXTEXT)/bin/python -m pip install --quiet $(JAX_MAXTEXT_PINS)
	$(VENV_MAXTEXT)/bin/python -m pip install --quiet --no-deps 'maxtext==$(MAXTEXT)'
	$(VENV_MAXTEXT)/bin/python -m pip install --quiet $(JAX_MAXTEXT_PINS) $(MAXTEXT_DEPS)
	$(VENV_MAXTEXT)/bin/python -c "import maxtext.trainers.pre_train.train_compile"
	touch $@

lint: $(VENV)/.installed-full
	$(BIN)/ruff check planner cli api scan_runtime fidelity tests bench examples
	$(BIN)/ruff format --check planner cli api scan_runtime fidelity tests bench examples
	$(BIN)/mypy
	PYTHONPATH=. $(BIN)/lint-imports --no-cache

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

# The release check (`make test-release`, not part of `make test`): the newest jax, jaxlib and libtpu the
# package index offers, in an environment of their own, against the pinned release (jax $(JAX_TODAY), whose
# Shardy cases are shared/shardy_cases_jax012): Shardy's propagation lit tests regenerated by the newest
# jaxlib's own passes from a copy of openxla/shardy (SHARDY_SRC, a clone or an unpacked archive: the check
# reaches only the package index, never GitHub), our Shardy engine on them, and the CI subset's JAX steps
# compiled by both releases (RELEASE_CASES='NAME ...' for some of them). Report: $(RELEASE_REPORT).
SHARDY_SRC ?=
RELEASE_CASES ?=
RELEASE_DIR ?= build/release
VENV_RELEASE ?= $(RELEASE_DIR)/venv
BIN_RELEASE := $(VENV_RELEASE)/bin
RELEASE_REPORT ?= bench/release_check.md
PINNED_SHARDY_CASES ?= $(or $(SPMD_SHARED_DIR),../shared)/shardy_cases_jax012/shardy_propagation_cases.json
# FileCheck, from Debian's LLVM tools (bookworm's LLVM 14; any release's FileCheck reads these tests).
LLVM_TOOLS ?= llvm-14-tools
# The newest release of a package as the index lists it now (run only when the recipe runs).
newest_release = $(shell $(PYTHON_JAX) -m pip index versions $(1) 2>/dev/null | sed -n 's/^$(1) (\(.*\))$$/\1/p')

.PHONY: test-release release-env filecheck
test-release: filecheck release-env $(VENV_JAX)/.installed
	$(BIN_JAX)/python -m fidelity.release_check refs --out $(RELEASE_DIR)/pinned_refs.json $(if $(RELEASE_CASES),--cases $(RELEASE_CASES))
	$(BIN_RELEASE)/python -m fidelity.release_check refs --out $(RELEASE_DIR)/newest_refs.json $(if $(RELEASE_CASES),--cases $(RELEASE_CASES))
	$(BIN_RELEASE)/python -m fidelity.release_check report --pinned $(PINNED_SHARDY_CASES) \
		$(if $(SHARDY_SRC),--shardy-src $(SHARDY_SRC)) --cases-out $(RELEASE_DIR)/shardy_propagation_cases.json \
		--baseline-refs $(RELEASE_DIR)/pinned_refs.json --release-refs $(RELEASE_DIR)/newest_refs.json --out $(RELEASE_REPORT)
	@cat $(RELEASE_REPORT)

# Remade whenever the index offers a newer jax, jaxlib or libtpu than the environment holds. libtpu is
# named itself: a new jax's `jax[tpu]` may pin a libtpu the index does not have yet. The planner goes in
# as pure Python, as in $(VENV_JAX).
release-env:
	@if [ -z "$(PYTHON_JAX)" ]; then echo "test-release: the newest jax needs Python 3.12, not found" >&2; exit 1; fi
	@versions="jax==$(call newest_release,jax) jaxlib==$(call newest_release,jaxlib) libtpu==$(call newest_release,libtpu)"; \
	case "$$versions" in *"== "*|*==) echo "test-release: the package index did not answer ($$versions)" >&2; exit 1;; esac; \
	if [ "$$(cat $(VENV_RELEASE)/.installed 2>/dev/null)" != "$$versions" ]; then \
		echo "release-env: $$versions"; rm -rf $(VENV_RELEASE) && $(PYTHON_JAX) -m venv $(VENV_RELEASE) && \
		$(BIN_RELEASE)/python -m pip install --quiet --upgrade pip && \
		$(BIN_RELEASE)/python -m pip install --quiet $$versions && \
		find planner -name '*.cpython-312-*.so' -delete && \
		SPMD_PLANNER_PURE=1 $(BIN_RELEASE)/python -m pip install --quiet -e '.[jax]' $$versions && \
		echo "$$versions" > $(VENV_RELEASE)/.installed; fi

filecheck:
	@ls /usr/lib/llvm-*/bin/FileCheck >/dev/null 2>&1 || command -v FileCheck >/dev/null 2>&1 || { \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $(LLVM_TOOLS) >/dev/null; }

"""Shared test fixtures: where the real references live.

The references (real dumps from torch_xla and JAX, XLA's own test cases) sit
in `../shared` beside the repository; `SPMD_SHARED_DIR` overrides that. Tests
fail, rather than skip, when they are missing: they are the point.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from postgres_server import PostgresServer

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SPMD_SHARED_DIR", REPO.parent / "shared"))
CORPUS = SHARED / "corpus"
XLA_CASES = SHARED / "xla_cases" / "sharding_propagation_cases.json"

# The tests on today's JAX run in their own environment (`make test-jax-today` sets JAX_TODAY to the
# release it installed); the main run, on the jax torch_xla pins, does not collect them.
collect_ignore = [] if os.environ.get("JAX_TODAY") else ["test_jax_today.py", "test_grid_today.py"]

if not CORPUS.is_dir() or not XLA_CASES.is_file():
    raise pytest.UsageError(f"reference data not found under {SHARED} (set SPMD_SHARED_DIR to the shared/ folder)")


def corpus_hlo_files() -> list[Path]:
    return sorted(CORPUS.glob("*/*.hlo"))


@cache
def xla_cases() -> list[dict]:
    return json.loads(XLA_CASES.read_text())["cases"]


def truth_files() -> list[Path]:
    return sorted(CORPUS.glob("torch_xla/*.truth.json")) + sorted(CORPUS.glob("jax/*.xla.json"))


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for the whole run (see `postgres_server`)."""
    # Not under pytest's temporary root: that is private to this user, and the server may run as another.
    root = Path(tempfile.mkdtemp(prefix="spmd-planner-postgres-"))
    server = PostgresServer(root).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each test that takes it runs twice: on a SQLite file, and on a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'plans.sqlite3'}"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.new_database()

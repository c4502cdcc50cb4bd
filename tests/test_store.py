"""The plan store on SQLite and on a real PostgreSQL server: migrations, content-addressed writes, replicas."""

from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import text

from api.store import PlanStore, database_url

SUMMARY = {"module": "m", "mesh": "fsdp=4,tp=2", "capacity_bytes": 95 << 30, "total_before": 40 << 30,
           "total_after": 17 << 30, "num_findings": 3}  # fmt: skip

# The schema as the store wrote it before it had migrations: a database a user already has.
UNMIGRATED = """
CREATE TABLE plans (id TEXT PRIMARY KEY, created_at REAL NOT NULL, module TEXT NOT NULL, mesh TEXT,
    capacity_bytes INTEGER, total_before INTEGER NOT NULL, total_after INTEGER NOT NULL,
    num_findings INTEGER NOT NULL, plan_json TEXT NOT NULL, patched_hlo_gz BLOB NOT NULL);
CREATE INDEX plans_by_time ON plans (created_at DESC);
CREATE TABLE searches (id TEXT PRIMARY KEY, created_at REAL NOT NULL, report_json TEXT NOT NULL);
"""


def test_bytes_past_2_to_the_31_round_trip(store_url: str) -> None:
    store = PlanStore(store_url)
    stored = store.put("a" * 64, '{"x": 1}', "HloModule m", SUMMARY)
    assert (stored.capacity_bytes, stored.total_before, stored.total_after) == (95 << 30, 40 << 30, 17 << 30)
    assert store.patched_hlo("a" * 64) == "HloModule m" and store.get("b" * 64) is None
    assert store.recent(10, 0)[0] == 1
    store.close()


def test_replicas_writing_the_same_plan_at_once_store_it_once(store_url: str) -> None:
    """Replicas start together (each migrates: one at a time) and compute the same plan: one row, the
    first writer's, and every replica answers with it."""
    with ThreadPoolExecutor(4) as pool:
        replicas = list(pool.map(lambda _: PlanStore(store_url), range(4)))
        answers = list(pool.map(lambda k: replicas[k % 4].put("c" * 64, "{}", f"HloModule m{k}", SUMMARY), range(16)))
        created = list(pool.map(lambda k: replicas[k % 4].put_search("s" * 64, f'{{"k": {k}}}'), range(8)))
    assert len({a.created_at for a in answers}) == 1 and len(set(created)) == 1
    total, rows = replicas[0].recent(10, 0)
    assert total == 1 and rows[0].id == "c" * 64
    assert replicas[1].patched_hlo("c" * 64) in {f"HloModule m{k}" for k in range(16)}
    with replicas[0].engine.connect() as db:
        assert db.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == "0003"
    for r in replicas:
        r.close()


def test_a_sqlite_file_from_before_migrations_is_adopted_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "plans.sqlite3"
    with sqlite3.connect(path) as db:
        db.executescript(UNMIGRATED)
        db.execute("INSERT INTO plans VALUES ('old', 1.0, 'm', NULL, NULL, 10, 5, 1, '{}', ?)", (b"",))
    store = PlanStore(path)
    assert store.get("old") is not None and store.recent(10, 0)[0] == 1
    store.put("new", "{}", "HloModule m", {**SUMMARY, "chip": "v6e", "verdict": "fits"})
    total, rows = store.recent(10, 0)
    # Rows from before the chip and verdict columns list neither; new rows both.
    assert total == 2 and {(r.id, r.chip, r.verdict) for r in rows} == {("new", "v6e", "fits"), ("old", None, None)}
    store.close()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("/var/lib/plans.sqlite3", "sqlite:////var/lib/plans.sqlite3"),
        ("sqlite:///plans.sqlite3", "sqlite:///plans.sqlite3"),
        ("postgresql://planner:pw@db:5432/plans", "postgresql+psycopg://planner:pw@db:5432/plans"),
    ],
    ids=["path", "sqlite_url", "postgresql_url"],
)
def test_database_urls(given: str, expected: str) -> None:
    assert database_url(given) == expected


def test_another_database_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="SQLite or PostgreSQL, not 'mysql'"):
        database_url("mysql://u@h/db")

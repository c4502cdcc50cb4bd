"""Stored plans: one SQLite file (WAL), keyed by a content hash of the request.

The key covers the HLO text and everything that changes the plan (mesh,
capacity, manifest, options), so the same request finds its stored plan and
a changed one never does. Plans survive restarts; each call opens its own
connection, so the store is safe to use from any thread.
"""

from __future__ import annotations

import gzip
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS plans (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    module TEXT NOT NULL,
    mesh TEXT,
    capacity_bytes INTEGER,
    total_before INTEGER NOT NULL,
    total_after INTEGER NOT NULL,
    num_findings INTEGER NOT NULL,
    plan_json TEXT NOT NULL,
    patched_hlo_gz BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS plans_by_time ON plans (created_at DESC);
CREATE TABLE IF NOT EXISTS searches (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    report_json TEXT NOT NULL
);
"""


@dataclass(frozen=True)
class StoredPlan:
    id: str
    created_at: float
    module: str
    mesh: str | None
    capacity_bytes: int | None
    total_before: int
    total_after: int
    num_findings: int
    plan_json: str


class PlanStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30)
        try:
            with db:  # commits, or rolls back on error
                yield db
        finally:
            db.close()

    def put(self, plan_id: str, plan_json: str, patched_hlo: str, summary: dict) -> StoredPlan:
        created = time.time()
        with self._connect() as db:
            db.execute(
                "INSERT OR IGNORE INTO plans VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    plan_id, created, summary["module"], summary["mesh"], summary["capacity_bytes"],
                    summary["total_before"], summary["total_after"], summary["num_findings"],
                    plan_json, gzip.compress(patched_hlo.encode(), compresslevel=6),
                ),
            )  # fmt: skip
        stored = self.get(plan_id)
        assert stored is not None
        return stored

    def get(self, plan_id: str) -> StoredPlan | None:
        with self._connect() as db:
            row = db.execute(
                "SELECT id, created_at, module, mesh, capacity_bytes, total_before, total_after, num_findings, "
                "plan_json FROM plans WHERE id = ?",
                (plan_id,),
            ).fetchone()
        return StoredPlan(*row) if row else None

    def patched_hlo(self, plan_id: str) -> str | None:
        with self._connect() as db:
            row = db.execute("SELECT patched_hlo_gz FROM plans WHERE id = ?", (plan_id,)).fetchone()
        return gzip.decompress(row[0]).decode() if row else None

    def recent(self, limit: int, offset: int) -> tuple[int, list[StoredPlan]]:
        with self._connect() as db:
            total = db.execute("SELECT COUNT(*) FROM plans").fetchone()[0]
            rows = db.execute(
                "SELECT id, created_at, module, mesh, capacity_bytes, total_before, total_after, num_findings, "
                "'' FROM plans ORDER BY created_at DESC, id LIMIT ? OFFSET ?",
                (limit, offset),
            ).fetchall()
        return int(total), [StoredPlan(*row) for row in rows]

    def put_search(self, search_id: str, report_json: str) -> float:
        """Keep a search report; the same report again keeps its first time. Returns its creation time."""
        with self._connect() as db:
            db.execute("INSERT OR IGNORE INTO searches VALUES (?, ?, ?)", (search_id, time.time(), report_json))
            row = db.execute("SELECT created_at FROM searches WHERE id = ?", (search_id,)).fetchone()
        return float(row[0])

    def get_search(self, search_id: str) -> tuple[float, str] | None:
        """(created_at, report JSON) of a stored search, or None."""
        with self._connect() as db:
            row = db.execute("SELECT created_at, report_json FROM searches WHERE id = ?", (search_id,)).fetchone()
        return (float(row[0]), str(row[1])) if row else None

"""Stored plans and searches: SQLite by default, PostgreSQL for a team's replicas.

Plans are keyed by a content hash of the request: the key covers the HLO text and everything that
changes the plan (mesh, capacity, manifest, options), so the same request finds its stored plan and
a changed one never does. Two replicas that compute the same plan at once store it once: an insert
of a key already there does nothing, and both answer with the row that won.

The database is named by a URL (`sqlite:///path`, `postgresql://user@host/db`); the store brings its
schema to the newest migration (`api/migrations`, Alembic) when it opens, one replica at a time on
PostgreSQL (an advisory lock), so replicas started together never race on a migration.
"""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, func, select, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url

from api.store_schema import plans, searches

_MIGRATIONS = Path(__file__).with_name("migrations")
# Any fixed number: the advisory lock replicas take while they migrate.
_MIGRATION_LOCK = 7_201_605
_MIGRATING = threading.Lock()


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
    chip: str | None
    verdict: str | None
    plan_json: str


def database_url(url_or_path: str | Path) -> str:
    """A SQLAlchemy URL: a plain path is a SQLite file; `postgresql://` speaks psycopg 3."""
    if isinstance(url_or_path, Path) or "://" not in url_or_path:
        return f"sqlite:///{Path(url_or_path)}"
    url = make_url(url_or_path)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    if url.get_backend_name() not in ("sqlite", "postgresql"):
        raise ValueError(f"the plan store is SQLite or PostgreSQL, not {url.get_backend_name()!r} ({url_or_path})")
    return url.render_as_string(hide_password=False)


def _engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database:
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _wal(dbapi_connection: Any, _: Any) -> None:
            # Readers never wait for the writer; one file serves every thread.
            dbapi_connection.execute("PRAGMA journal_mode=WAL")

        return engine
    try:
        return create_engine(url, pool_pre_ping=True)
    except ImportError as e:
        raise ValueError(f"a PostgreSQL store needs psycopg: pip install 'spmd-planner[team]' ({e})") from e


def shown_url(url_or_path: str | Path) -> str:
    """The database for a log line: its URL without the password."""
    return make_url(database_url(url_or_path)).render_as_string(hide_password=True)


def _alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    return config


def _migrate(connection: Connection) -> None:
    config = _alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


class PlanStore:
    def __init__(self, url_or_path: str | Path) -> None:
        self.url = database_url(url_or_path)
        self.engine = _engine(self.url)
        self.dialect = self.engine.dialect.name
        # Read once: readiness probes ask the database, not the migration files, each time.
        self.newest_revision = ScriptDirectory.from_config(_alembic_config()).get_current_head()
        # Alembic's `context` and `op` are process-wide: stores opening in two threads take turns, each
        # until its migration is committed.
        with _MIGRATING, self.engine.begin() as db:
            if self.dialect == "postgresql":
                db.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
            _migrate(db)

    def at_newest_revision(self) -> bool:
        """Whether the database is at the newest migration this server knows (another replica may be newer)."""
        with self.engine.connect() as db:
            return MigrationContext.configure(db).get_current_revision() == self.newest_revision

    def close(self) -> None:
        self.engine.dispose()

    def _insert(self, table: Any) -> Any:
        """INSERT that leaves a row with the same key as it is (the first writer's)."""
        dialect = postgresql if self.dialect == "postgresql" else sqlite
        return dialect.insert(table).on_conflict_do_nothing(index_elements=["id"])

    def put(self, plan_id: str, plan_json: str, patched_hlo: str, summary: dict) -> StoredPlan:
        row = {
            "id": plan_id,
            "created_at": time.time(),
            "module": summary["module"],
            "mesh": summary["mesh"],
            "capacity_bytes": summary["capacity_bytes"],
            "total_before": summary["total_before"],
            "total_after": summary["total_after"],
            "num_findings": summary["num_findings"],
            "chip": summary.get("chip"),
            "verdict": summary.get("verdict"),
            "plan_json": plan_json,
            "patched_hlo_gz": gzip.compress(patched_hlo.encode(), compresslevel=6),
        }
        with self.engine.begin() as db:
            db.execute(self._insert(plans).values(**row))
        stored = self.get(plan_id)
        assert stored is not None
        return stored

    def _plan_columns(self, with_json: bool) -> list[Any]:
        c = plans.c
        return [c.id, c.created_at, c.module, c.mesh, c.capacity_bytes, c.total_before, c.total_after,
                c.num_findings, c.chip, c.verdict, c.plan_json if with_json else text("''")]  # fmt: skip

    def get(self, plan_id: str) -> StoredPlan | None:
        with self.engine.connect() as db:
            row = db.execute(select(*self._plan_columns(True)).where(plans.c.id == plan_id)).first()
        return StoredPlan(*row) if row else None

    def patched_hlo(self, plan_id: str) -> str | None:
        with self.engine.connect() as db:
            data = db.execute(select(plans.c.patched_hlo_gz).where(plans.c.id == plan_id)).scalar()
        return gzip.decompress(data).decode() if data is not None else None

    def recent(self, limit: int, offset: int) -> tuple[int, list[StoredPlan]]:
        with self.engine.connect() as db:
            total = db.execute(select(func.count()).select_from(plans)).scalar_one()
            rows = db.execute(
                select(*self._plan_columns(False))
                .order_by(plans.c.created_at.desc(), plans.c.id)
                .limit(limit)
                .offset(offset)
            ).all()
        return int(total), [StoredPlan(*row) for row in rows]

    def put_search(self, search_id: str, report_json: str) -> float:
        """Keep a search report; the same report again keeps its first time. Returns its creation time."""
        with self.engine.begin() as db:
            db.execute(self._insert(searches).values(id=search_id, created_at=time.time(), report_json=report_json))
            created = db.execute(select(searches.c.created_at).where(searches.c.id == search_id)).scalar_one()
        return float(created)

    def get_search(self, search_id: str) -> tuple[float, str] | None:
        """(created_at, report JSON) of a stored search, or None."""
        with self.engine.connect() as db:
            row = db.execute(
                select(searches.c.created_at, searches.c.report_json).where(searches.c.id == search_id)
            ).first()
        return (float(row[0]), str(row[1])) if row else None

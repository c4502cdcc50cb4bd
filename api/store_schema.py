"""The store's tables, one definition for SQLite and PostgreSQL (SQLAlchemy Core).

The migrations under `api/migrations` create and change them; this module is what the queries use.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Double, Index, Integer, LargeBinary, MetaData, String, Table, Text

metadata = MetaData()

plans = Table(
    "plans",
    metadata,
    # A content hash of the request: the same request is the same row, whichever replica computed it.
    Column("id", String(64), primary_key=True),
    Column("created_at", Double, nullable=False),
    Column("module", Text, nullable=False),
    Column("mesh", Text),
    # Bytes per chip pass 2^31 on any large step: 64-bit columns.
    Column("capacity_bytes", BigInteger),
    Column("total_before", BigInteger, nullable=False),
    Column("total_after", BigInteger, nullable=False),
    Column("num_findings", Integer, nullable=False),
    Column("plan_json", Text, nullable=False),
    Column("patched_hlo_gz", LargeBinary, nullable=False),
    # The chip preset planned for, and the verdict after the plan (fits, does not fit, ...): NULL on rows
    # from before revision 0003.
    Column("chip", Text),
    Column("verdict", Text),
)
Index("plans_by_time", plans.c.created_at.desc())

searches = Table(
    "searches",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("created_at", Double, nullable=False),
    Column("report_json", Text, nullable=False),
)

# Long work (verify) as jobs any replica can report on: the row is the truth, the worker running
# attempt `attempt` writes it, and a row whose worker stopped beating is retried or failed. While an
# attempt waits for a worker, the replica that sent it beats for it.
jobs = Table(
    "jobs",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("state", String(16), nullable=False),  # queued | running | done | failed
    Column("progress", Double, nullable=False),
    Column("message", Text, nullable=False),
    Column("request_json", Text, nullable=False),
    Column("result_json", Text),
    Column("error", Text),
    Column("attempt", Integer, nullable=False),
    Column("owner", String(64), nullable=False),  # who asked: a token's digest, or "anonymous"
    Column("replica", String(32), nullable=False),  # the replica that sent the current attempt to Ray
    Column("created_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    Column("heartbeat_at", Double, nullable=False),
)
Index("jobs_by_state", jobs.c.state, jobs.c.heartbeat_at)

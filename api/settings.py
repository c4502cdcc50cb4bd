"""Service settings, from `SPMD_PLANNER_*` environment variables.

SPMD_PLANNER_DB_PATH=/var/lib/spmd-planner/plans.sqlite3
SPMD_PLANNER_DB=postgresql://planner@db/planner   # a team's shared store (wins over DB_PATH)
SPMD_PLANNER_TOKEN=...            # bearer token required for POST (unset: open)
SPMD_PLANNER_TIME_LIMIT_SECONDS=120
SPMD_PLANNER_LOG_FORMAT=json      # request log as one JSON object a line (default: text)
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from api.request_log import LogFormat


def default_db_path() -> Path:
    """Under the user's data directory (XDG), as a desktop tool would keep it."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "spmd-planner" / "plans.sqlite3"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPMD_PLANNER_")

    db_path: Path = Field(default_factory=default_db_path, description="SQLite file holding the stored plans")
    db: str | None = Field(
        default=None,
        description="database URL (sqlite:///path or postgresql://user@host/db) every replica shares; "
        "unset: the SQLite file db_path",
    )
    max_body_bytes: int = Field(default=64 << 20, ge=1, description="largest request body, and largest HLO text")
    time_limit_seconds: float = Field(default=120.0, gt=0, description="wall time one plan may take")
    max_workers: int = Field(default=2, ge=1, description="plans computed at once, each in a process of its own")
    token: str | None = Field(default=None, description="bearer token required for POST; unset: no auth")
    cors_origins: list[str] = Field(default_factory=list, description="origins allowed by CORS; empty: CORS off")
    page_size: int = Field(default=20, ge=1, le=500)
    log_format: LogFormat = Field(default="text", description="request log lines: text, or one JSON object a line")
    ray_address: str | None = Field(default=None, description="Ray cluster jobs run on; unset: a local Ray")
    job_heartbeat_seconds: float = Field(default=2.0, gt=0, description="how often a job's worker says it lives")
    job_stale_seconds: float = Field(default=20.0, gt=0, description="a job not heard from this long is retried")
    job_attempts: int = Field(default=2, ge=1, description="attempts of a job before it fails")
    job_check_seconds: float = Field(default=5.0, gt=0, description="how often a replica looks for stalled jobs")
    jobs_per_token: int = Field(default=4, ge=1, description="queued and running jobs one token may have at once")
    requests_per_minute: int = Field(default=600, ge=1, description="POSTs one token may make per minute")
    search_builders: list[str] = Field(
        default_factory=list,
        description="MODULE:FUNCTION step builders search jobs may run (code the service imports: the operator "
        "names them; JSON list)",
    )


def store_location(settings: Settings) -> str | Path:
    return settings.db if settings.db else settings.db_path


@cache
def get_settings() -> Settings:
    return Settings()

"""The planner's HTTP service: POST /plan, stored plans, and the HBM dashboard.

The names below load on first use: the planner processes the service starts import
`api.plan_job` alone, without FastAPI and the routes (a third of a second each).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from api.main import create_app
    from api.settings import Settings

__all__ = ["Settings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from api.main import create_app

        return create_app
    if name == "Settings":
        from api.settings import Settings

        return Settings
    raise AttributeError(f"module 'api' has no attribute {name!r}")

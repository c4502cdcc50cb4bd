"""The planner's HTTP service: POST /plan, stored plans, and the HBM dashboard."""

from api.main import create_app
from api.settings import Settings

__all__ = ["Settings", "create_app"]

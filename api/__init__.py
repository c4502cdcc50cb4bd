"""The planner's HTTP service: POST /plan, stored plans, and the HBM dashboard."""

from api.main import create_app

__all__ = ["create_app"]

"""The planner's HTTP service (POST /plan, stored plans, HBM dashboard)."""

"""The planner: findings, root causes, placements and their predicted gain."""

"""The planner: findings, root causes, placements and their predicted gain."""

from planner.plan.manifest import Manifest, ManifestParameter, spec_from_sharding, spec_sharding
from planner.plan.model import Plan
from planner.plan.planner import make_plan

__all__ = ["Manifest", "ManifestParameter", "Plan", "make_plan", "spec_from_sharding", "spec_sharding"]

"""The planner: findings, root causes, placements and their predicted gain, one room per job.

- `diagnosis/`: findings, root causes, the split picture, what holds the peak.
- `fixes/`: placements and their names in the user's words, next steps.
- `compilers/`: verification by real compilers and the drivers that compile.
- `planner` puts them together; `model` is the plan as the API returns it; `jax_terms` is a plan in JAX's
  PartitionSpecs, with a JAX step's manifest and lowering.
"""

from planner.plan.manifest import Manifest, ManifestParameter
from planner.plan.model import Plan
from planner.plan.planner import make_plan
from planner.sharding.partition_spec import spec_from_sharding, spec_sharding

__all__ = ["Manifest", "ManifestParameter", "Plan", "clear_caches", "make_plan", "spec_from_sharding", "spec_sharding"]


def clear_caches() -> None:
    """Forgets what planning memoises across calls: shardings laid out over a mesh for the next steps."""
    from planner.plan.fixes import remesh

    remesh._axis_layout.cache_clear()

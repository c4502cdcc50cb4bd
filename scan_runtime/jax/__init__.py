"""The JAX side of the client: plan a training step from abstract inputs, apply the plan inside `scan`.

    from scan_runtime.jax import plan_step, scan

    plan = plan_step(loss_fn, params, batch, mesh=mesh)  # lowered and planned: nothing allocated
    ...
    y, _ = scan(layer, x, params["layers"])  # each layer's weights (and so their gradients) pinned as planned

`params` and `batch` may be `jax.ShapeDtypeStruct`s carrying a `NamedSharding` (a 405B-shaped step plans on
a laptop) or arrays. Needs jax (the `xla` extra); torch is not imported.
"""

from planner.errors import PlanMismatch
from planner.plan.jax_terms import JaxPlan, active_plan, step_manifest, use_plan
from scan_runtime.jax.scan import scan
from scan_runtime.jax.step import plan_step

__all__ = ["JaxPlan", "PlanMismatch", "active_plan", "plan_step", "scan", "step_manifest", "use_plan"]

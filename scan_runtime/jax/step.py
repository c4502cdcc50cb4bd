"""`plan_step`: lower a JAX training step from abstract inputs, plan it, and make the plan active.

The step is `jax.value_and_grad(loss_fn)(params, *batch)`, lowered by `jax.jit` and never compiled or run
(`planner.plan.jax_terms.lower_step`): its outputs are the loss and then the gradients in the order of params'
leaves, which is what the manifest says (`step_manifest`: output i + 1 is the gradient of leaf i, named by its
path, with the partition spec of its `NamedSharding`). The partitioner is JAX's own setting
(`jax_use_shardy_partitioner`), and the step is simulated with that partitioner's rules (the plan's
`partitioner` says which).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planner.mesh import to_planner_mesh
from planner.plan.jax_terms import JaxPlan, activate, lower_step
from scan_runtime.client import PlannerClient


def plan_step(
    loss_fn: Callable[..., Any],
    params: Any,
    *batch: Any,
    mesh: Any,
    chip: str | None = None,
    hbm_bytes: int | None = None,
    client: PlannerClient | None = None,
    make_active: bool = True,
) -> JaxPlan | None:
    """The plan for training `loss_fn(params, *batch) -> scalar loss` on `mesh` (a `jax.sharding.Mesh`).

    `chip` (a preset) or `hbm_bytes` sets the capacity, as for `PlannerClient`, which plans in process or
    through the service at its `url`. Returns None only for a lenient client that cannot reach the service.
    """
    hlo, manifest = lower_step(loss_fn, params, *batch)
    client = client or PlannerClient(mesh=to_planner_mesh(mesh), chip=chip, hbm_bytes=hbm_bytes)
    if client.mesh is None:
        client.mesh = to_planner_mesh(mesh)
    result = client.plan(hlo, manifest)
    plan = JaxPlan.from_plan(result.plan, mesh, manifest, result.plan_id) if result is not None else None
    if make_active:
        activate(plan)
    return plan

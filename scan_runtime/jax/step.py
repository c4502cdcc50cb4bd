"""`plan_step`: lower a JAX training step from abstract inputs, plan it, and make the plan active.

The step is `jax.value_and_grad(loss_fn)(params, *batch)`, lowered by `jax.jit` and never compiled or run:
its outputs are the loss and then the gradients in the order of params' leaves, which is what the manifest
says (`step_manifest`: output i + 1 is the gradient of leaf i, named by its path, with the partition spec
of its `NamedSharding`). The partitioner is JAX's own setting (`jax_use_shardy_partitioner`), and the step
is simulated with that partitioner's rules (the plan's `partitioner` says which).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planner.plan.manifest import Manifest, ManifestParameter
from scan_runtime.client import PlannerClient, to_planner_mesh
from scan_runtime.jax.plan import JaxPlan, activate, use_plan


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


def lower_step(loss_fn: Callable[..., Any], params: Any, *batch: Any) -> tuple[str, Manifest]:
    """The step's HLO text, lowered by `jax.jit` and never compiled, and its manifest."""
    import jax

    manifest = step_manifest(params)
    with use_plan(None):  # the step as written: a plan active from before must not pin what is planned
        lowered = jax.jit(jax.value_and_grad(loss_fn)).lower(params, *batch)
    return lowered.as_text(dialect="hlo"), manifest


def step_manifest(params: Any) -> Manifest:
    """Output 0 the loss, output i + 1 the gradient of params' leaf i; each leaf's path, shape and spec."""
    import jax
    from jax.sharding import NamedSharding

    parameters = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        name = jax.tree_util.keystr(path)
        sharding = getattr(leaf, "sharding", None)
        if not isinstance(sharding, NamedSharding):
            raise ValueError(
                f"parameter {name} has sharding {sharding!r}: give each parameter a NamedSharding over the "
                "mesh (jax.ShapeDtypeStruct(shape, dtype, sharding=...) or a placed array)"
            )
        spec = list(sharding.spec) + [None] * (len(leaf.shape) - len(sharding.spec))
        parameters.append(ManifestParameter(
            name=name, shape=list(leaf.shape), partition_spec=[_axes(a, name) for a in spec]
        ))  # fmt: skip
    return Manifest(outputs=[None, *(p.name for p in parameters)], parameters=parameters)


def _axes(dim: Any, name: str) -> str | list[str] | None:
    if dim is None or isinstance(dim, str):
        return dim
    if isinstance(dim, tuple) and all(isinstance(a, str) for a in dim):
        return list(dim)
    raise ValueError(f"parameter {name} has partition spec entry {dim!r}: the planner reads axis names and None")

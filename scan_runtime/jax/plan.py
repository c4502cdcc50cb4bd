"""A plan in JAX's terms: a `PartitionSpec` per parameter path, for one layer's slice and for the gradient.

The plan's recommended `pin-parameter` placements name a scanned parameter by its path in the step's
params (`['layers']['wq']`, `jax.tree_util.keystr`) and the partition spec of one layer's slice. Inside the
scanned body `with_sharding_constraint` on that slice is what XLA honours for both directions: the
constraint is linear, and its transpose constrains the slice's cotangent, so the per-layer gradient the
backward loop writes into the stacked gradient carries the parameter's sharding. `pin-output` placements
name a gradient the step returns: `gradient_specs` says how to return it (`out_shardings`, or
`constrain_gradients` on the gradients before they leave the step).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from planner.plan.manifest import Manifest
from planner.plan.model import Plan
from planner.plan.placements import PIN_OUTPUT
from scan_runtime.client import to_planner_mesh
from scan_runtime.layer_plan import PlanMismatch


def partition_spec(spec: list[Any]) -> Any:
    """The plan's spec (per dim: an axis name, a list of them, or None) as a `jax.sharding.PartitionSpec`."""
    from jax.sharding import PartitionSpec

    return PartitionSpec(*(tuple(a) if isinstance(a, list) else a for a in spec))


@dataclass(frozen=True, eq=False)
class JaxPlan:
    """Where the plan pins: parameter path -> PartitionSpec of one layer's slice, and of returned gradients."""

    layer_specs: Mapping[str, Any]
    gradient_specs: Mapping[str, Any]
    mesh: Any  # jax.sharding.Mesh
    # Every parameter of the step, path -> shape as given (stacked): how a scan's xs are found again.
    parameters: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    plan: Plan | None = None
    plan_id: str | None = None
    notes: tuple[str, ...] = ()

    @staticmethod
    def from_plan(plan: Plan, mesh: Any, manifest: Manifest, plan_id: str | None = None) -> JaxPlan:
        """The recommended placements of `plan` for the step `manifest` describes, checked against `mesh`."""
        wanted = to_planner_mesh(mesh).to_text()
        if plan.mesh is not None and plan.mesh != wanted:
            raise PlanMismatch(f"the plan is for mesh {plan.mesh}, the step runs on {wanted}")
        parameters = {p.name: tuple(p.shape) for p in manifest.parameters}
        layer_specs: dict[str, Any] = {}
        gradient_specs: dict[str, Any] = {}
        notes = []
        for p in plan.placements:
            if not p.recommended:
                continue
            # The spec applied is the one the plan shows the user (`p.user`), so the client compiles what
            # the plan tells a user to write.
            user = p.user
            if p.kind == "pin-parameter":
                if user is None or user.parameter not in parameters or user.partition_spec is None:
                    raise PlanMismatch(f"placement {p.id} names no parameter of this step, so it cannot be "
                                       "applied in the scanned body")  # fmt: skip
                layer_specs[user.parameter] = partition_spec(user.partition_spec)
            elif p.kind == PIN_OUTPUT:
                position = int(p.id.split(":", 1)[1])
                name = manifest.outputs[position] if position < len(manifest.outputs) else None
                if name is None or user is None or user.partition_spec is None:
                    raise PlanMismatch(f"placement {p.id} pins output {position}, which is no parameter's gradient")
                gradient_specs[name] = partition_spec(user.partition_spec)
            else:
                notes.append(f"{p.id} ({p.kind}) is torch_xla's shard_as regrouping: a JAX step has no groups")
        return JaxPlan(layer_specs, gradient_specs, mesh, parameters, plan, plan_id, tuple(notes))

    def sharding(self, spec: Any) -> Any:
        from jax.sharding import NamedSharding

        return NamedSharding(self.mesh, spec)

    def constrain_gradients(self, grads: Any) -> Any:
        """`grads` (the params' tree) with each gradient a `pin-output` placement names pinned as planned."""
        import jax

        def pin(path: Any, g: Any) -> Any:
            spec = self.gradient_specs.get(jax.tree_util.keystr(path))
            return g if spec is None else jax.lax.with_sharding_constraint(g, self.sharding(spec))

        return jax.tree_util.tree_map_with_path(pin, grads)


_ACTIVE: contextvars.ContextVar[JaxPlan | None] = contextvars.ContextVar("scan_runtime_jax_plan", default=None)


def active_plan() -> JaxPlan | None:
    """The plan `scan` applies when given none."""
    return _ACTIVE.get()


def activate(plan: JaxPlan | None) -> None:
    _ACTIVE.set(plan)


@contextmanager
def use_plan(plan: JaxPlan | None) -> Iterator[None]:
    """Make `plan` the active one inside the block (None: scan plainly)."""
    token = _ACTIVE.set(plan)
    try:
        yield
    finally:
        _ACTIVE.reset(token)

"""A plan in JAX's terms: a `PartitionSpec` per parameter path, for one layer's slice and for the gradient.

The plan's recommended `pin-parameter` placements name a scanned parameter by its path in the step's
params (`['layers']['wq']`, `jax.tree_util.keystr`) and the partition spec of one layer's slice. Inside the
scanned body `with_sharding_constraint` on that slice is what XLA honours for both directions: the
constraint is linear, and its transpose constrains the slice's cotangent, so the per-layer gradient the
backward loop writes into the stacked gradient carries the parameter's sharding. `pin-output` placements
name a gradient the step returns: `gradient_specs` says how to return it (`out_shardings`, or
`constrain_gradients` on the gradients before they leave the step).

A JAX step's side of it: `lower_step` lowers `jax.value_and_grad(loss_fn)` without compiling it, and
`step_manifest` says which output is whose gradient. The active plan (`use_plan`) is what the JAX client's
`scan` pins; the configuration search makes each candidate's plan active while the compiler confirms it.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from planner.errors import PlanMismatch
from planner.mesh import to_planner_mesh
from planner.plan.fixes.placements import PIN_OUTPUT
from planner.plan.manifest import Manifest, ManifestParameter
from planner.plan.model import Plan


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


_ACTIVE: contextvars.ContextVar[JaxPlan | None] = contextvars.ContextVar("planner_jax_plan", default=None)


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

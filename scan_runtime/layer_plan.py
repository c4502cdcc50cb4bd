"""What a plan asks of the step, in the framework's terms, and whether it fits the model.

A plan's recommended `pin-parameter` placements name a parameter inside the
scanned layer (`mlp.down.weight`) and a partition spec over the mesh's axis
names; inside the body each such weight slice goes through
`mark_sharding_with_gradients`, which pins the slice and its gradient. Its
`pin-output` placements name a parameter of the model (`model.embed_tokens.weight`)
whose returned gradient is to be sharded like it: `mark_sharding` on its
`.grad` once backward has written it (`scan_runtime.gradient_pins`).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from planner.errors import PlanMismatch
from planner.plan.fixes.placements import PIN_OUTPUT, PIN_PARAMETER
from planner.plan.model import Plan


@dataclass(frozen=True, eq=False)
class LayerPlan:
    """Pins to apply inside scanned bodies: parameter name within a layer -> partition spec."""

    pins: Mapping[str, tuple[Any, ...]]
    mesh: Any  # torch_xla.distributed.spmd.Mesh
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # one layer's, as the plan saw them
    plan: Plan | None = None
    plan_id: str | None = None
    notes: tuple[str, ...] = field(default=())
    # The model's parameter name -> the partition spec its gradient gets where backward writes it.
    gradient_pins: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    @staticmethod
    def from_plan(plan: Plan, mesh: Any, plan_id: str | None = None) -> LayerPlan:
        """The recommended pins of `plan`, checked against the mesh they will run on."""
        names = tuple(mesh.axis_names or ())
        shape = tuple(int(n) for n in mesh.mesh_shape)
        if plan.mesh is not None:
            wanted = ",".join(f"{n}={s}" for n, s in zip(names, shape))
            if plan.mesh != wanted:
                raise PlanMismatch(f"the plan is for mesh {plan.mesh}, the model runs on {wanted}")
        pins: dict[str, tuple[Any, ...]] = {}
        gradient_pins: dict[str, tuple[Any, ...]] = {}
        shapes: dict[str, tuple[int, ...]] = {}
        notes = []
        for p in plan.placements:
            if not p.recommended:
                continue
            if p.kind in (PIN_PARAMETER, PIN_OUTPUT):
                if p.torch is None:
                    raise PlanMismatch(f"placement {p.id} has no parameter name (the plan was made without a "
                                       "manifest), so it cannot be applied")  # fmt: skip
                # The spec the plan shows the user (derived from the pin's sharding), when the mesh let it.
                shown = p.user.partition_spec if p.user is not None else None
                chosen = shown if shown is not None else p.torch.partition_spec
                spec = tuple(tuple(a) if isinstance(a, list) else a for a in chosen)
                unknown = [a for dim in spec for a in (dim if isinstance(dim, tuple) else (dim,)) if a is not None
                           and a not in names]  # fmt: skip
                if unknown:
                    raise PlanMismatch(f"placement {p.id} shards {p.torch.parameter} over {unknown}, "
                                       f"not axes of the mesh {names}")  # fmt: skip
                if p.kind == PIN_OUTPUT:
                    gradient_pins[p.torch.parameter] = spec
                    continue
                pins[p.torch.parameter] = spec
                if p.torch.shape:
                    shapes[p.torch.parameter] = tuple(p.torch.shape)
            else:
                # torch_xla gives every same-shaped pair in scan's backward one shard_as group id and
                # offers no handle to renumber them; the plan's pins are applied, the split is not.
                notes.append(f"{p.id}: {p.summary} has no torch_xla equivalent; not applied")
        return LayerPlan(pins, mesh, shapes, plan, plan_id, tuple(notes), gradient_pins)

    def check_parameters(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Every pinned name is a parameter of the layer, and its spec has the parameter's rank."""
        unknown = sorted(set(self.pins) - set(shapes))
        if unknown:
            raise PlanMismatch(f"the plan pins {unknown}, which the scanned layer does not have "
                               f"(it has {sorted(shapes)})")  # fmt: skip
        for name, spec in self.pins.items():
            planned = self.shapes.get(name)
            if planned is not None and tuple(planned) != tuple(shapes[name]):
                raise PlanMismatch(f"the plan was made for {name} of shape {tuple(planned)}, but the scanned layer's "
                                   f"{name} has shape {tuple(shapes[name])}")  # fmt: skip
            if len(spec) != len(shapes[name]):
                raise PlanMismatch(f"the plan pins {name} with partition spec {spec}, but {name} has "
                                   f"shape {tuple(shapes[name])}")  # fmt: skip


_UNSET: Any = object()
_ACTIVE: contextvars.ContextVar[Any] = contextvars.ContextVar("spmd_planner_plan", default=_UNSET)
_DEFAULT: list[LayerPlan | None] = [None]


def current_plan() -> LayerPlan | None:
    """The plan of the innermost `use_plan` (None there means none), else the one `activate` set."""
    plan = _ACTIVE.get()
    return _DEFAULT[0] if plan is _UNSET else plan  # type: ignore[no-any-return]


def activate(plan: LayerPlan | None) -> None:
    """Make `plan` the default for every following scan (None: back to plain torch_xla)."""
    _DEFAULT[0] = plan


@contextmanager
def use_plan(plan: LayerPlan | None) -> Iterator[LayerPlan | None]:
    token = _ACTIVE.set(plan)
    try:
        yield plan
    finally:
        _ACTIVE.reset(token)

"""Placements: the annotations that fix a finding, in HLO terms and in the framework's.

Two kinds:
- pin a scanned parameter: its one-layer slice inside the forward body and
  its one-layer gradient inside the backward body get a Sharding custom-call
  with the parameter's sharding. In torch_xla that is
  `mark_sharding_with_gradients(weight, mesh, spec)` on the weight inside the
  scanned function; the gradient's pin is what keeps the weight-gradient dot
  from leaving the accumulator split over fewer devices.
  Under gradient accumulation the same placement also pins each outer
  loop's accumulator of that gradient (`acc + gradient`, in the outer body)
  to the stacked parameter's sharding: the pin inside the backward body fixes
  the stacked gradient, and the accumulator's own pin keeps the sum from
  settling on another sharding across microbatches.
- split a shard_as group: members that were tied only because they share a
  group id (torch_xla 2.9's scan uses one id per shape) get one group per
  (gradient, weight) pair, so each gradient follows its own weight.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from planner.hlo.ir.module import Attribute, Computation, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.hlo.ir.unique_names import fresh_name
from planner.hlo.text.shardy_import import (
    SHARDY,
    declares_meshes,
    module_meshes,
    partitioner_of,
    sdy_sharding_attribute,
    shardy_constraint,
)
from planner.plan.diagnosis.output_pairs import OutputGradient
from planner.plan.diagnosis.scan_pairs import AccumulatedGradient, StackedGradient, is_shard_group_only, layer_sharding
from planner.sharding import algebra
from planner.sharding.hlo_sharding import HloSharding, ShardGroup
from planner.sharding.partition_spec import AxisSpec
from planner.sharding.shardy import SdyMesh
from planner.sharding.text import parse_sharding


@dataclass(frozen=True)
class Annotation:
    """One HLO edit: a Sharding custom-call after `instruction`, or a new shard_as group on it."""

    computation: str
    instruction: str
    sharding: str | None = None
    unspecified_dims: tuple[int, ...] = ()
    shard_as: int | None = None

    def describe(self) -> str:
        if self.shard_as is not None:
            return f"{self.instruction} ({self.computation}): shard_as group {self.shard_as}"
        dims = f" unspecified_dims={list(self.unspecified_dims)}" if self.unspecified_dims else ""
        return f"{self.instruction} ({self.computation}): Sharding {self.sharding}{dims}"


PIN_PARAMETER = "pin-parameter"
SPLIT_SHARD_GROUP = "split-shard-group"


@dataclass(frozen=True)
class TorchPin:
    """The framework-level form of a pin: what to call, inside the scanned layer unless `call` says where."""

    parameter: str
    partition_spec: tuple[AxisSpec, ...]
    shape: tuple[int, ...]  # one layer's
    call: str = "mark_sharding_with_gradients"


@dataclass(frozen=True)
class PinnedValue:
    """What a pin fixes, as the user's code holds it: one layer's slice of a scanned parameter (its layer dim
    dropped), or a returned gradient whole, with the sharding the pin gives it."""

    sharding: HloSharding
    shape: tuple[int, ...]
    label: str | None = None  # the user's name for it, where the module's metadata gives one
    key: str | None = None  # where the module carries it (`while.953[6]`), for when no name is known


@dataclass(frozen=True)
class Placement:
    id: str
    kind: str  # "pin-parameter" | "split-shard-group"
    summary: str
    fixes: tuple[str, ...]  # finding keys ("while.1[38]") or "shard_as group N"
    annotations: tuple[Annotation, ...]
    torch_pin: TorchPin | None = None
    torch_pairs: tuple[tuple[str, ...], ...] = field(default=())  # shard_as pairs after a split
    pinned: PinnedValue | None = None


def pin_parameter(
    module: HloModule, gradient: StackedGradient, accumulated: Sequence[AccumulatedGradient] = ()
) -> Placement | None:
    """Pin the parameter of `gradient` (and so the gradient) to the parameter's sharding, per layer;
    and each accumulator of it in `accumulated` to the stacked parameter's sharding."""
    if gradient.ideal is None:
        return None
    annotations = []
    parameter = gradient.parameter
    if parameter is not None and parameter.layer_slice is not None:
        annotations.append(_pin(module, parameter.body, parameter.layer_slice, gradient.ideal))
    if gradient.layer_gradient is not None:
        annotations.append(_pin(module, gradient.body, gradient.layer_gradient, gradient.ideal))
    else:
        # No one-layer value to pin: pin the accumulator update itself.
        annotations.append(Annotation(gradient.body, gradient.producer, gradient.ideal.to_short_text()))
    sums = [a for a in accumulated if a.gradient.key == gradient.key]
    annotations += [Annotation(a.body, a.update, gradient.ideal.to_short_text()) for a in sums]
    who = gradient.name or (parameter.key if parameter is not None else gradient.key)
    where = "inside the scanned body" + (" and on its accumulator over microbatches" if sums else "")
    spec = tuple(gradient.partition_spec) if gradient.partition_spec is not None else None
    return Placement(
        id=f"pin:{gradient.key}",
        kind=PIN_PARAMETER,
        summary=f"pin {who} and its gradient to {gradient.ideal.to_short_text()} {where}",
        fixes=(gradient.key, *(a.key for a in sums)),
        annotations=tuple(annotations),
        torch_pin=(
            TorchPin(gradient.name, spec, gradient.shape.dims[1:])
            if gradient.name is not None and spec is not None
            else None
        ),
        pinned=PinnedValue(
            _one_layer(gradient.ideal), gradient.shape.dims[1:], key=parameter.key if parameter is not None else None
        ),
    )


PIN_OUTPUT = "pin-output"


# torch_xla's form of a pin-output: the gradient annotated where backward has written it.
MARK_GRADIENT = "mark_sharding on the parameter's .grad once backward has written it"


def pin_output(
    module: HloModule, gradient: OutputGradient, name: str | None = None, spec: tuple[AxisSpec, ...] | None = None
) -> Placement:
    """Pin a returned gradient to its parameter's sharding just before the step returns it (JAX:
    `with_sharding_constraint` on it, or `out_shardings`; torch_xla: `mark_sharding` on the gradient).

    `name` and `spec`, the parameter's as a manifest names them, give the framework's form."""
    key = f"{module.entry_name}[{gradient.position}]"
    ideal = gradient.ideal.to_short_text()
    label = name or gradient.label
    return Placement(
        id=f"{PIN_OUTPUT}:{gradient.position}",
        kind=PIN_OUTPUT,
        summary=f"pin output {gradient.position}, the gradient of {label}, to {ideal} where returned",
        fixes=(key,),
        annotations=(Annotation(module.entry_name, gradient.value, ideal),),
        torch_pin=TorchPin(name, spec, gradient.shape.dims, MARK_GRADIENT) if name and spec is not None else None,
        pinned=PinnedValue(gradient.ideal, gradient.shape.dims, name or _metadata_label(gradient)),
    )


def _metadata_label(gradient: OutputGradient) -> str | None:
    """The parameter's name from its metadata; `label` falls back to the HLO name, which is no user's."""
    return gradient.label if gradient.label != gradient.parameter else None


def _pin(module: HloModule, comp: str, name: str, stacked: HloSharding) -> Annotation:
    """A pin for one layer's value: the layer dim dropped, or, where the value keeps it as a
    size-1 dim, left unspecified so propagation decides it."""
    shape = module.computation(comp)[name].shape
    assert isinstance(shape, ArrayShape), f"{name} is not an array"
    layer = _one_layer(stacked)
    if layer.is_tiled and shape.rank == layer.tiled_data_rank + 1:
        return Annotation(comp, name, algebra.add_dims(layer, 0, 1).to_short_text(), unspecified_dims=(0,))
    if layer.is_tiled and shape.rank != layer.tiled_data_rank:
        raise ValueError(f"cannot pin {name} {shape.to_text(False)} in {comp} to {layer.to_text()}: ranks differ")
    return Annotation(comp, name, layer.to_short_text())


def _one_layer(stacked: HloSharding) -> HloSharding:
    return layer_sharding(stacked, stacked.tiled_data_rank - 1) if stacked.is_tiled else stacked


def split_group(module: HloModule, group: int, next_id: int) -> Placement | None:
    """One shard_as group per (gradient, weight) pair: the members an inlined pairing call returns together."""
    members = {
        inst.name
        for comp in module.computations
        for inst in comp.instructions
        if is_shard_group_only(inst.sharding) and inst.sharding.shard_group.id == group  # type: ignore[union-attr]
    }
    pairs: list[tuple[str, ...]] = []
    home: dict[str, str] = {}
    for comp in module.computations:
        for inst in comp.instructions:
            if inst.opcode == "tuple":
                tied = tuple(o for o in inst.operands if o in members)
                if len(tied) >= 2 and tied not in pairs:
                    pairs.append(tied)
                    home.update((name, comp.name) for name in tied)
    if len(pairs) < 2:
        return None
    annotations = [Annotation(home[name], name, shard_as=next_id + k) for k, pair in enumerate(pairs) for name in pair]
    return Placement(
        id=f"split:group{group}",
        kind=SPLIT_SHARD_GROUP,
        summary=f"split shard_as group {group} into {len(pairs)} groups, one per pair tied by one shard_as call",
        fixes=(f"shard_as group {group}",),
        annotations=tuple(annotations),
        torch_pairs=tuple(pairs),
    )


def max_group_id(module: HloModule) -> int:
    ids = [
        inst.sharding.shard_group.id
        for comp in module.computations
        for inst in comp.instructions
        if inst.sharding is not None and not inst.sharding.is_tuple and inst.sharding.shard_group is not None
    ]
    return max(ids, default=-1)


def apply_placements(
    module: HloModule, placements: list[Placement], aliases: Mapping[str, str] | None = None
) -> HloModule:
    """A new module with every annotation of `placements` applied.

    Annotations name instructions of the module as written (`PreparedModule.front`); in the module a
    compiler's passes made of it, an instruction a pass retired is annotated where `aliases` (the
    pipeline's renames) says its value now is.
    """
    by_comp: dict[str, list[Annotation]] = {}
    for p in placements:
        for a in p.annotations:
            by_comp.setdefault(a.computation, []).append(a)
    absent = sorted(set(by_comp) - {comp.name for comp in module.computations})
    if absent:
        raise ValueError(f"placement names {absent}, not computations of module {module.name}")
    if aliases:
        by_comp = {name: [_held(module.computation(name), a, aliases) for a in annotated]
                   for name, annotated in by_comp.items()}  # fmt: skip
    taken = {inst.name for comp in module.computations for inst in comp}
    # In a Shardy module a pin is Shardy's sharding constraint too, as `with_sharding_constraint` writes it.
    meshes = module_meshes(module) if partitioner_of(module) == SHARDY else None
    declared = declares_meshes(module)
    comps = [
        _annotate(comp, by_comp[comp.name], taken, meshes, declared) if comp.name in by_comp else comp
        for comp in module.computations
    ]
    return dataclasses.replace(module, computations=tuple(comps))


def _held(comp: Computation, a: Annotation, aliases: Mapping[str, str]) -> Annotation:
    """`a` on the instruction of `comp` that holds its instruction's value (itself, where no pass retired it)."""
    if a.instruction in comp:
        return a
    return dataclasses.replace(a, instruction=aliases.get(a.instruction, a.instruction))


def _annotate(
    comp: Computation,
    annotations: list[Annotation],
    taken: set[str],
    meshes: dict[str, SdyMesh] | None = None,
    declared: bool = True,
) -> Computation:
    pins = {a.instruction: a for a in annotations if a.sharding is not None}
    regroup = {a.instruction: a.shard_as for a in annotations if a.shard_as is not None}
    missing = (set(pins) | set(regroup)) - {i.name for i in comp}
    if missing:
        raise ValueError(f"placement names {sorted(missing)}, not instructions of computation {comp.name}")
    renamed: dict[str, str] = {}
    out: list[Instruction] = []
    for inst in comp.instructions:
        operands = tuple(renamed.get(o, o) for o in inst.operands)
        if operands != inst.operands:
            inst = dataclasses.replace(inst, operands=operands)
        if inst.name in regroup:
            inst = _with_group(inst, regroup[inst.name])
        out.append(inst)
        pin = pins.get(inst.name)
        if pin is None:
            continue
        name = fresh_name(f"{inst.name}.pinned", taken)
        sharding = parse_sharding(pin.sharding or "")
        attributes = [
            Attribute("custom_call_target", "Sharding", '"Sharding"'),
            Attribute("sharding", sharding, sharding.to_text()),
        ]
        if pin.unspecified_dims:
            config = f"unspecified_dims=[{','.join(map(str, pin.unspecified_dims))}]"
            attributes.append(Attribute("backend_config", config, f'"{config}"'))
        if meshes is not None and isinstance(inst.shape, ArrayShape):
            open_dims = tuple(pin.unspecified_dims or ())
            constraint = shardy_constraint(sharding, inst.shape.rank, meshes, open_dims, declared)
            if constraint is not None:
                attributes.append(sdy_sharding_attribute((constraint,)))
        out.append(Instruction(name, "custom-call", inst.shape, (inst.name,), tuple(attributes)))
        renamed[inst.name] = name
    root = renamed.get(comp.root_name, comp.root_name)
    return dataclasses.replace(comp, instructions=tuple(out), root_name=root)


def _with_group(inst: Instruction, group: int) -> Instruction:
    s = inst.sharding
    assert s is not None and s.shard_group is not None, f"{inst.name} is not in a shard group"
    regrouped = s.with_shard_group(ShardGroup(group, s.shard_group.shard_as))
    attributes = tuple(
        Attribute("sharding", regrouped, regrouped.to_text()) if a.key == "sharding" else a for a in inst.attributes
    )
    return dataclasses.replace(inst, attributes=attributes)

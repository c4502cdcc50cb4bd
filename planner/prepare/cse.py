"""Common subexpressions merged, as XLA's HloCSE merges them (XLA:TPU runs it before its loop passes).

Two instructions of one computation are the same value when they have the same opcode, shape,
operands (in either order for commutative ops), opcode attributes, sharding and called computations
(compared by structure); constants are the same when their shapes and literals are (a literal the
dump elided, `{...}`, equals no other). The first in
program order stays and every reader of the others reads it. Metadata and frontend attributes are
not compared: XLA's `HloInstruction::Identical` ignores them.

Why it matters for propagation: JAX emits one RoPE table per `rope(q)` and `rope(k)` call; merged,
both loops' init tuples carry the same instruction at two indices, which the while-loop simplifier
then carries once (`while_simplifier.repeated_elements`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import ClassVar

from planner.hlo.ir.attributes import ComputationRefs
from planner.hlo.ir.module import HloModule, Instruction
from planner.hlo.ir.shapes import Shape, TupleShape
from planner.prepare.edit import ComputationEdit, ModuleEdit, has_side_effect
from planner.prepare.rewrite import Rewrite

# HloOpcodeIsBinaryCommutative.
COMMUTATIVE = frozenset({"add", "multiply", "maximum", "minimum", "and", "or", "xor"})
# Not part of an instruction's identity (HloInstruction::Identical does not compare them).
_IGNORED = frozenset({"metadata", "frontend_attributes", "statistics_viz", "origin"})


def shape_key(shape: Shape) -> Hashable:
    """Shapes compared as XLA compares them before layout assignment: element types and dims."""
    if isinstance(shape, TupleShape):
        return tuple(shape_key(e) for e in shape.elements)
    return (shape.element_type, shape.dims)


class Identity:
    """Structural identity of instructions and computations within one module."""

    def __init__(self, edit: ModuleEdit, partitioned: Callable[[str], Hashable] | None = None) -> None:
        self._edit = edit
        self._computations: dict[str, Hashable] = {}
        # After partitioning, two instructions are one value only where they are also split alike: what
        # `partitioned` gives for each name is part of its identity.
        self._partitioned = partitioned

    def computation(self, name: str) -> Hashable:
        """A computation by its structure: instructions in order, operands by position, names aside."""
        if name not in self._computations:
            comp = self._edit[name]
            position: dict[str, int] = {}
            parts = []
            for k, inst in enumerate(comp):
                position[inst.name] = k
                operands = tuple(position[o] for o in inst.operands)
                parts.append((self._own(inst), operands, inst.parameter_number))
            self._computations[name] = (tuple(parts), position[comp.root_name])
        return self._computations[name]

    def _own(self, inst: Instruction) -> Hashable:
        attrs = []
        for a in inst.attributes:
            if a.key in _IGNORED:
                continue
            value = a.value
            if isinstance(value, ComputationRefs):
                value = tuple(self.computation(c) for c in value.names)
            attrs.append((a.key, _hashable(value)))
        return (inst.opcode, shape_key(inst.shape), inst.literal_key, tuple(attrs))

    def key(self, inst: Instruction, comp: ComputationEdit) -> Hashable:
        """The instruction's identity, its operands by their (already merged) names; an iota operand
        by what it is, as HloCSE compares iotas (same dimension, same shape)."""
        operands: tuple[Hashable, ...] = tuple(
            ("iota", comp[o].attr("iota_dimension"), shape_key(comp[o].shape)) if comp[o].opcode == "iota" else o
            for o in inst.operands
        )
        if inst.opcode in COMMUTATIVE and len(operands) == 2:
            operands = tuple(sorted(operands, key=repr))
        if self._partitioned is not None:
            return (self._own(inst), operands, self._partitioned(inst.name))
        return (self._own(inst), operands)


def _hashable(value: object) -> Hashable:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value  # type: ignore[return-value]


def merge_common_subexpressions(
    edit: ModuleEdit, partitioned: Callable[[str], Hashable] | None = None
) -> dict[str, str]:
    """Returns the merged names and the instruction each now reads as (`partitioned`: see `Identity`)."""
    identity = Identity(edit, partitioned)
    merged: dict[str, str] = {}
    for comp in edit.computations.values():
        merged.update(_merge_in(comp, identity))
    return merged


def _merge_in(comp: ComputationEdit, identity: Identity) -> dict[str, str]:
    merged: dict[str, str] = {}
    constants: dict[Hashable, str] = {}
    for inst in comp:
        if inst.opcode != "constant":
            continue
        key: Hashable = (shape_key(inst.shape), inst.literal_key)
        if key in constants:
            _merge(comp, inst.name, constants[key], merged)
        else:
            constants[key] = inst.name
    representatives: dict[Hashable, str] = {}
    for inst in comp:
        if (not inst.operands and inst.opcode not in ("partition-id", "replica-id")) or has_side_effect(inst):
            continue
        key = identity.key(inst, comp)
        if key in representatives:
            _merge(comp, inst.name, representatives[key], merged)
        else:
            representatives[key] = inst.name
    return merged


def _merge(comp: ComputationEdit, duplicate: str, keep: str, merged: dict[str, str]) -> None:
    comp.replace_uses(duplicate, keep)
    comp.remove(duplicate)
    merged[duplicate] = keep


@dataclass(frozen=True)
class HloCse:
    NAME: ClassVar[str] = "cse"
    MIRRORS: ClassVar[str] = "xla/service/hlo_cse.cc"

    # After partitioning: each name's split, part of its identity (see `Identity`).
    partitioned: Callable[[str], Hashable] | None = None

    def run(self, module: HloModule) -> Rewrite:
        edit = ModuleEdit(module)
        merged = merge_common_subexpressions(edit, self.partitioned)
        if not merged:
            return Rewrite(module)
        return Rewrite(edit.freeze(), merged, f"{len(merged)} common subexpressions merged")

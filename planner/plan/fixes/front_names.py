"""A placement found on the prepared module, written in the names of the module as written.

The planner finds its placements on `PreparedModule.module`, the module the target compiler's
passes leave, and writes them into `front` (the module as written, inlined: what is printed back
patched and compiled) as well as into `module` (what the plan simulates). Most instructions keep
one name through both; a pass can make an instruction `front` lacks, or give a name an earlier pass
retired to a new instruction (`PreparedModule.made`). XLA:TPU's `tpu-reduce-rewriter` reduces a
bias gradient before its reshape:

    front:   reduce.2173 = f32[256] reduce(reshape.1870), dimensions={0,1}
    module:  reduce.1    = f32[8,32] reduce(transpose.1869), dimensions={0,1}
             reshape.1   = f32[256] reshape(reduce.1)        (aliases: reduce.2173 -> reshape.1)

A pin of `reshape.1` is written on `reduce.2173`: the pass moved that value, shape and all, to
`reshape.1`, so pinning one in the module as written is pinning the other after the passes. A pin
of `reduce.1` has no such instruction (no value of the module as written is `f32[8,32]`): the
placement cannot be written, and says so instead of naming an instruction the user's module lacks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from planner.hlo.ir.module import Computation, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.plan.fixes.placements import Annotation, Placement
from planner.prepare import PreparedModule


@dataclass(frozen=True)
class Unwritable:
    """A placement no edit of the module as written expresses (its annotations in the prepared module's
    names), and why."""

    placement: Placement
    reason: str


def written_on_front(
    placements: Sequence[Placement], prepared: PreparedModule
) -> tuple[list[Placement], list[Unwritable]]:
    """`placements` in the names of `prepared.front`, and those it has no instructions for."""
    written: list[Placement] = []
    unwritable: list[Unwritable] = []
    for p in placements:
        on_front = front_placement(p, prepared)
        if isinstance(on_front, Unwritable):
            unwritable.append(on_front)
        else:
            written.append(on_front)
    return written, unwritable


def front_placement(placement: Placement, prepared: PreparedModule) -> Placement | Unwritable:
    """`placement`, found on `prepared.module`, with each annotation on the instruction of `prepared.front`
    that holds the same value; or why one of its annotations has none."""
    annotations = []
    for a in placement.annotations:
        on_front = _front_annotation(a, prepared)
        if isinstance(on_front, str):
            return Unwritable(placement, on_front)
        annotations.append(on_front)
    return dataclasses.replace(placement, annotations=tuple(annotations))


def _front_annotation(a: Annotation, prepared: PreparedModule) -> Annotation | str:
    """`a` on the front's instruction of the same value, or the reason there is none."""
    compiler = f"XLA:{prepared.compiler.upper()}"
    if not prepared.front.has_computation(a.computation):
        return (
            f"pins {a.instruction} in {a.computation}, a computation {compiler}'s passes make; the module as "
            f"written has no such computation to annotate"
        )
    front = prepared.front.computation(a.computation)
    made_by = prepared.made.get(a.instruction)
    if made_by is None and a.instruction in front:
        return a
    holder = _retired_holder(front, a, prepared)
    if holder is not None:
        return dataclasses.replace(a, instruction=holder)
    maker = f"{compiler}'s {made_by}" if made_by is not None else f"{compiler}'s passes"
    return (
        f"pins {a.instruction} in {a.computation}, which {maker} makes; the module as written has no such "
        f"instruction to annotate"
    )


def _retired_holder(front: Computation, a: Annotation, prepared: PreparedModule) -> str | None:
    """The first instruction of `front` (program order) that a pass retired into `a`'s instruction, of the same
    shape, and in a shard_as group where `a` regroups one; None when there is none."""
    value = prepared.module.computation(a.computation)[a.instruction]
    retired = {name for name, holder in prepared.aliases.items() if holder == a.instruction}
    for inst in front:
        if inst.name in retired and _same_array(inst, value) and (a.shard_as is None or _in_group(inst)):
            return inst.name
    return None


def _same_array(a: Instruction, b: Instruction) -> bool:
    return (
        isinstance(a.shape, ArrayShape)
        and isinstance(b.shape, ArrayShape)
        and (a.shape.element_type, a.shape.dims) == (b.shape.element_type, b.shape.dims)
    )


def _in_group(inst: Instruction) -> bool:
    """Whether `inst` carries a shard_as group a split can renumber."""
    s = inst.sharding
    return s is not None and not s.is_tuple and s.shard_group is not None

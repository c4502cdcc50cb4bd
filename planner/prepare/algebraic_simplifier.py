"""The rewrites of XLA's AlgebraicSimplifier that change what sharding propagation does.

XLA:TPU runs `algsimp` many times before it partitions. Most of its rewrites leave propagation's
decisions where they were; these do not, because propagation treats the opcodes differently:
- a `broadcast` that only inserts size-1 dims (its dims in order, as many elements out as in) is a
  `reshape` (`AlgebraicSimplifierVisitor::HandleBroadcast`). Propagation moves a sharding forward
  through a broadcast only at its last aggressiveness level, through a reshape from the first: on a
  torch_xla scan step the per-layer gradient torch_xla unsqueezes with a broadcast hands its
  sharding to the stacked gradient three levels early;
- ops that change nothing are their operand: a broadcast or reshape to the operand's own shape, a
  convert to the operand's own type, a copy, a transpose that keeps the dim order, a slice of the
  whole operand. Each was a step propagation had to cross.
- a reshape of a reshape is one reshape.
- a subtraction of a constant is an addition of its negation (`HandleSubtract`:
  `A - C => A + negate(C)`, C a constant or a broadcast of one, A not a constant). What this changes
  for propagation is the loops: a reversed scan's index `(n - i) - 1` becomes
  `(n - i) + negate(1)`, and `negate(1)` is loop-invariant work the loop-invariant motion hoists
  (constant folding, constant sinking and the loop simplifier then take it out again), so XLA:TPU
  rebuilds the backward scan, and every loop around it, once more than the planner did: that
  decides the order propagation visits the loops in (the computation list, rebuilt ones last).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from planner.hlo.ir import HloModule, Instruction
from planner.hlo.shapes import ArrayShape
from planner.prepare.edit import ComputationEdit, ModuleEdit
from planner.prepare.rewrite import Rewrite


def _array(inst: Instruction) -> ArrayShape | None:
    return inst.shape if isinstance(inst.shape, ArrayShape) else None


def _same_array(a: ArrayShape, b: ArrayShape) -> bool:
    return a.element_type == b.element_type and a.dims == b.dims


def _identity(comp: ComputationEdit, inst: Instruction) -> bool:
    """The instruction returns its operand unchanged."""
    shape = _array(inst)
    if shape is None or not inst.operands:
        return False
    operand = _array(comp[inst.operands[0]])
    if operand is None or not _same_array(shape, operand):
        return False
    if inst.opcode in ("broadcast", "reshape", "convert", "copy", "bitcast"):
        return True
    if inst.opcode == "transpose":
        return tuple(inst.attr("dimensions") or ()) == tuple(range(shape.rank))
    # A slice with the same dims in and out takes the whole operand.
    return inst.opcode == "slice"


def _broadcast_is_reshape(comp: ComputationEdit, inst: Instruction) -> bool:
    shape, operand = _array(inst), _array(comp[inst.operands[0]])
    if shape is None or operand is None:
        return False
    dims = tuple(inst.attr("dimensions") or ())
    return list(dims) == sorted(dims) and shape.num_elements == operand.num_elements


def _unannotated_reshape(inst: Instruction) -> bool:
    return inst.opcode == "reshape" and inst.sharding is None


def _subtract_of_constant(edit: ModuleEdit, comp: ComputationEdit, inst: Instruction) -> str | None:
    """`A - C => A + (-C)` (`AlgebraicSimplifierVisitor::HandleSubtract`): C is a constant, or a
    broadcast of one (negated, then broadcast again), and A is not a constant. Returns the new add."""
    shape = _array(inst)
    lhs, rhs = (comp[o] for o in inst.operands)
    if shape is None or lhs.opcode == "constant":
        return None
    broadcast = rhs if rhs.opcode == "broadcast" else None
    constant = comp[rhs.operands[0]] if broadcast is not None else rhs
    if constant.opcode != "constant":
        return None
    negate = Instruction(edit.fresh_name("negate"), "negate", constant.shape, (constant.name,))
    comp.add(negate, before=inst.name)
    negative = negate.name
    if broadcast is not None:
        dims = tuple(a for a in broadcast.attributes if a.key == "dimensions")
        again = dataclasses.replace(broadcast, name=edit.fresh_name("broadcast"), operands=(negative,), attributes=dims)
        comp.add(again, before=inst.name)
        negative = again.name
    add = Instruction(edit.fresh_name("add"), "add", shape, (lhs.name, negative))
    comp.add(add, before=inst.name)
    return add.name


@dataclass(frozen=True)
class AlgebraicSimplifier:
    NAME: ClassVar[str] = "algsimp"
    MIRRORS: ClassVar[str] = "xla/service/algebraic_simplifier.cc (the rewrites that change propagation)"

    def run(self, module: HloModule) -> Rewrite:
        edit = ModuleEdit(module)
        renamed: dict[str, str] = {}
        rewritten = 0
        negated = 0
        for comp in edit.computations.values():
            for inst in comp:
                if inst.sharding is not None or inst.name == comp.root_name:
                    continue  # an annotated value is the user's word; a root is what the caller reads
                if _identity(comp, inst):
                    comp.replace_uses(inst.name, inst.operands[0])
                    comp.remove(inst.name)
                    renamed[inst.name] = inst.operands[0]
                elif inst.opcode == "broadcast" and _broadcast_is_reshape(comp, inst):
                    attrs = tuple(a for a in inst.attributes if a.key != "dimensions")
                    comp.replace(dataclasses.replace(inst, opcode="reshape", attributes=attrs))
                    rewritten += 1
                elif inst.opcode == "reshape" and _unannotated_reshape(comp[inst.operands[0]]):
                    inner = comp[inst.operands[0]]
                    comp.set_operands(inst.name, inner.operands)
                    rewritten += 1
                elif inst.opcode == "subtract" and (add := _subtract_of_constant(edit, comp, inst)) is not None:
                    comp.replace_uses(inst.name, add)
                    comp.remove(inst.name)
                    renamed[inst.name] = add
                    negated += 1
        if not (renamed or rewritten):
            return Rewrite(module)
        removed = len(renamed) - negated
        parts = [f"{removed} identity ops removed"] if removed else []
        parts += [f"{rewritten} broadcasts and reshapes rewritten as simpler reshapes"] if rewritten else []
        parts += [f"{negated} subtractions of a constant rewritten as additions"] if negated else []
        return Rewrite(edit.freeze(), renamed, "; ".join(parts))

"""Dead code and redundant tuples: XLA's HloDCE and TupleSimplifier, which the loop passes lean on.

Both run after every loop pass in XLA:TPU's pipeline: the loop passes leave get-tuple-elements of
tuples and instructions nothing reads, and what propagation sees is the module after both.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from planner.hlo.ir.module import HloModule, Instruction
from planner.hlo.ir.shapes import TupleShape
from planner.prepare.edit import ComputationEdit, ModuleEdit, has_side_effect
from planner.prepare.rewrite import Rewrite


def remove_dead_code(edit: ModuleEdit) -> int:
    """XLA's HloDCE on every computation, then the computations nothing calls; returns how many went."""
    removed = 0
    for comp in list(edit.computations.values()):
        removed += len(_dead_in(comp, edit))
    removed += len(edit.remove_unreachable_computations())
    return removed


def _dead_in(comp: ComputationEdit, edit: ModuleEdit) -> list[str]:
    removed: list[str] = []
    changed = True
    while changed:
        changed = False
        for inst in reversed(list(comp)):
            if comp.has_users(inst.name) or inst.name == comp.root_name or not _removable(inst, comp, edit):
                continue
            comp.remove(inst.name)
            removed.append(inst.name)
            changed = True
    return removed


def _removable(inst: Instruction, comp: ComputationEdit, edit: ModuleEdit) -> bool:
    """HloDCE's test: never a parameter, nothing with a side effect, no While whose body has one."""
    if inst.opcode == "parameter" or has_side_effect(inst):
        return False
    if inst.opcode == "while":
        return not any(has_side_effect(i) for c in inst.called_computations for i in edit[c])
    if inst.opcode == "custom-call" and inst.attr("custom_call_target") == "Sharding":
        # A Sharding annotation on a root, a parameter or a value with other readers stays: it is
        # the user's word about that value, read or not.
        operand = comp[inst.operands[0]]
        return not (
            operand.name == comp.root_name or operand.opcode == "parameter" or len(comp.users(operand.name)) > 1
        )
    return True


@dataclass(frozen=True)
class HloDce:
    NAME: ClassVar[str] = "dce"
    MIRRORS: ClassVar[str] = "xla/service/hlo_dce.cc"

    def run(self, module: HloModule) -> Rewrite:
        edit = ModuleEdit(module)
        removed = remove_dead_code(edit)
        return Rewrite(edit.freeze(), summary=f"{removed} dead instructions removed") if removed else Rewrite(module)


def simplify_tuples(edit: ModuleEdit) -> dict[str, str]:
    """XLA's TupleSimplifier: a tuple of its operand's elements in order is that operand; an element
    read out of a tuple op is the op's operand. Returns the names replaced and what replaced them."""
    replaced: dict[str, str] = {}
    for comp in edit.computations.values():
        for inst in comp:
            if inst.opcode == "tuple":
                whole = _whole_tuple(comp, inst)
                if whole is not None and _replace_keeping_sharding(comp, inst, whole):
                    replaced[inst.name] = whole
            elif inst.opcode == "get-tuple-element":
                element = _element_source(comp, inst)
                if element is not None and _replace_keeping_sharding(comp, inst, element):
                    replaced[inst.name] = element
    return replaced


def _whole_tuple(comp: ComputationEdit, tuple_inst: Instruction) -> str | None:
    top: str | None = None
    for k, name in enumerate(tuple_inst.operands):
        operand = comp[name]
        if operand.opcode != "get-tuple-element" or operand.attr("index") != k:
            return None
        if top is None:
            top = operand.operands[0]
            shape = comp[top].shape
            if not isinstance(shape, TupleShape) or _dims(shape) != _dims(tuple_inst.shape):
                return None
        elif operand.operands[0] != top:
            return None
    return top


def _dims(shape: object) -> object:
    if isinstance(shape, TupleShape):
        return tuple(_dims(e) for e in shape.elements)
    return (shape.element_type, shape.dims)  # type: ignore[attr-defined]


def _element_source(comp: ComputationEdit, gte: Instruction) -> str | None:
    """For a chain of get-tuple-elements over tuple ops, the operand the chain selects."""
    path: list[int] = []
    current = gte
    while current.opcode == "get-tuple-element":
        path.append(current.attr("index"))
        current = comp[current.operands[0]]
    replacement = current
    for index in reversed(path):
        if replacement.opcode != "tuple":
            return None
        replacement = comp[replacement.operands[index]]
    return replacement.name


def _replace_keeping_sharding(comp: ComputationEdit, old: Instruction, new_name: str) -> bool:
    """HloComputation::ReplaceInstruction with preserve_sharding: refused when both carry different
    shardings; the replacement inherits `old`'s sharding when it has none."""
    new = comp[new_name]
    if old.sharding is not None:
        if new.sharding is not None and new.sharding != old.sharding:
            return False
        if new.sharding is None:
            attrs = (*new.attributes, *(a for a in old.attributes if a.key == "sharding"))
            comp.replace(dataclasses.replace(new, attributes=attrs))
    comp.replace_uses(old.name, new_name)
    if not comp.has_users(old.name) and old.name != comp.root_name:
        comp.remove(old.name)
    return True


@dataclass(frozen=True)
class TupleSimplifier:
    NAME: ClassVar[str] = "tuple-simplifier"
    MIRRORS: ClassVar[str] = "xla/service/tuple_simplifier.cc"

    def run(self, module: HloModule) -> Rewrite:
        edit = ModuleEdit(module)
        replaced = simplify_tuples(edit)
        if not replaced:
            return Rewrite(module)
        return Rewrite(edit.freeze(), replaced, f"{len(replaced)} tuple reads folded")

"""Dead loop elements made pass-through, then the loop simplifier, tuples and dead code (XLA's HloModuleDCE).

An element of a While's tuple is live when something after the loop reads it, when the condition
or a side effect depends on it, or when a live element's next value is computed from it (a fixed
point over the body, XLA's `HloLivenessAnalysis` at tuple-element granularity). A dead element's
update in the body is replaced by passing the element through, so its computation dies; the
while-loop simplifier that runs next (the whole of it, repeated elements included: XLA:TPU's first
loop clean-up happens here) then removes it from the tuple.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from planner.hlo.ir.module import HloModule
from planner.prepare.dead_code import remove_dead_code, simplify_tuples
from planner.prepare.edit import ComputationEdit, ModuleEdit, get_tuple_element, has_side_effect
from planner.prepare.rewrite import Rewrite
from planner.prepare.while_simplifier import simplify_loops
from planner.prepare.while_state import LoopView, parameter, whiles


@dataclass(frozen=True)
class HloModuleDce:
    NAME: ClassVar[str] = "hlo-module-dce"
    MIRRORS: ClassVar[str] = "xla/service/hlo_module_dce.cc"

    def run(self, module: HloModule) -> Rewrite:
        edit = ModuleEdit(module)
        passed_through = sum(_pass_dead_elements_through(loop) for loop in whiles(edit))
        simplified = simplify_loops(edit)
        folded = simplify_tuples(edit)
        removed = remove_dead_code(edit)
        if not (passed_through or simplified or folded or removed):
            return Rewrite(module)
        parts = [f"{passed_through} dead loop elements passed through"] if passed_through else []
        parts += simplified
        return Rewrite(edit.freeze(), folded, "; ".join(parts) or "dead code removed")


def live_elements(loop: LoopView) -> set[int]:
    """The loop's live tuple elements (see the module docstring)."""
    body, condition, parent = loop.body, loop.condition, loop.parent
    arity = len(loop.shape.elements)
    reached = _reached(parent)
    users = [u for u in parent.users(loop.name) if u.name in reached]
    if parent.root_name == loop.name or any(u.opcode != "get-tuple-element" for u in users):
        live = set(range(arity))
    else:
        live = {u.attr("index") for u in users}
    body_reads = _reads(body)
    live |= _reads(condition)[condition.root_name]
    for comp, reads in ((body, body_reads), (condition, _reads(condition))):
        for inst in comp:
            if has_side_effect(inst):
                live |= reads[inst.name]
    root = body.root
    frontier = list(live)
    while frontier:
        i = frontier.pop()
        for k in body_reads.get(root.operands[i], set()) if root.opcode == "tuple" else range(arity):
            if k not in live:
                live.add(k)
                frontier.append(k)
    return live


def _reached(comp: ComputationEdit) -> set[str]:
    """What the computation's root or a side effect needs: a read nothing needs keeps nothing live."""
    stack = [comp.root_name, *(i.name for i in comp if has_side_effect(i))]
    reached: set[str] = set()
    while stack:
        name = stack.pop()
        if name not in reached:
            reached.add(name)
            stack.extend(comp[name].operands)
    return reached


def _reads(comp: ComputationEdit) -> dict[str, set[int]]:
    """For each instruction, the elements of the computation's parameter it is computed from."""
    param = parameter(comp).name
    reads: dict[str, set[int]] = {}
    for inst in comp:
        if inst.name == param:
            reads[inst.name] = set()
        elif inst.opcode == "get-tuple-element" and inst.operands[0] == param:
            reads[inst.name] = {inst.attr("index")}
        else:
            found: set[int] = set()
            for op in inst.operands:
                found |= reads[op] if op != param else set(range(len(comp[param].shape.leaves())))
            reads[inst.name] = found
    return reads


def _pass_dead_elements_through(loop: LoopView) -> int:
    body = loop.body
    if body.root.opcode != "tuple" or not loop.body.parameters or not loop.condition.parameters:
        return 0
    live = live_elements(loop)
    param = parameter(body)
    root = body.root
    changed = 0
    operands = list(root.operands)
    for i, name in enumerate(root.operands):
        if i in live:
            continue
        current = body[name]
        if current.opcode == "get-tuple-element" and current.operands[0] == param.name and current.attr("index") == i:
            continue
        gte = get_tuple_element(loop.edit.fresh_name("get-tuple-element"), param.name, param.shape, i)  # type: ignore[arg-type]
        body.add(gte, before=root.name)
        operands[i] = gte.name
        changed += 1
    if changed:
        body.set_operands(root.name, tuple(operands))
        body.remove_dead()
    return changed

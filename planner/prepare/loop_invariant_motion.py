"""Loop-invariant work hoisted out of While bodies (XLA's WhileLoopInvariantCodeMotion, default options).

In each body, an instruction whose operands are all loop-invariant (elements the body passes through
unchanged, constants, or instructions already hoisted) is computed once before the loop and carried
into it as a new, unchanged tuple element. Instructions that only move or replicate data
(broadcast, reshape, transpose, slice, iota, ...) and constants are "not worth hoisting
individually": they count as invariant, and are hoisted only as operands of something that is.
Options as XLA:TPU runs it: constants and reshapes are not hoisted on their own, everything else
is, but nothing whose result is larger than its operands (`hoist_size_inflation_ratio`, 1 here).
That limit is why an iota (no operands, so any result inflates) is never invariant on XLA:TPU: a
causal mask or RoPE table a remat'ed body computes from iotas stays in the body (observed on a
`dots`-remat Llama step: the loop carries 27 elements, as it would with no motion at all, while the
scalar `negate(constant(1))` beside it is hoisted). Loops that run at most once are left alone.

For sharding, a hoisted value becomes a carried element: it joins the loop's tuple, and its readers
in the body read it through the parameter.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from planner.hlo.ir.module import HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape, TupleShape
from planner.prepare.dead_code import remove_dead_code
from planner.prepare.edit import ComputationEdit, ModuleEdit, get_tuple_element, has_side_effect
from planner.prepare.rewrite import Rewrite
from planner.prepare.while_simplifier import loop_trip_count
from planner.prepare.while_state import LoopView, append_elements, invariant_gtes, parameter, whiles

# WhileLoopInvariantCodeMotion::NotWorthHoistingIndividually, with its default options.
NOT_WORTH_ALONE = frozenset({"constant", "reshape", "bitcast", "broadcast", "iota", "reverse", "slice", "transpose",
                             "tuple"})  # fmt: skip
_BLOCKING_CALLS = frozenset({"SPMDFullToShardShape", "SPMDShardShapeToFull"})


@dataclass(frozen=True)
class WhileLoopInvariantCodeMotion:
    NAME: ClassVar[str] = "while-loop-invariant-code-motion"
    MIRRORS: ClassVar[str] = "xla/service/while_loop_invariant_code_motion.cc"

    hoist_size_inflation_ratio: float | None = 1.0

    def run(self, module: HloModule) -> Rewrite:
        edit = ModuleEdit(module)
        hoisted = 0
        # Callees before callers, as XLA collects them (MakeComputationPostOrder): inner loops first,
        # so what an inner loop's motion leaves in an outer body is hoisted by the outer loop's.
        for loop in whiles(edit, edit.post_order()):
            hoisted += hoist(loop, self.hoist_size_inflation_ratio)
        if not hoisted:
            return Rewrite(module)
        remove_dead_code(edit)
        return Rewrite(edit.freeze(), summary=f"{hoisted} loop-invariant instructions hoisted out of loop bodies")


def _not_worth_alone(inst: Instruction) -> bool:
    if inst.opcode == "custom-call" and inst.attr("custom_call_target") == "Sharding":
        return True
    return inst.opcode in NOT_WORTH_ALONE


def _inflates(inst: Instruction, body: ComputationEdit, ratio: float | None) -> bool:
    if ratio is None or inst.opcode == "constant":
        return False
    operands = sum(leaf.byte_size for op in inst.operands for leaf in body[op].shape.leaves())
    return sum(leaf.byte_size for leaf in inst.shape.leaves()) > operands * ratio


def hoist(loop: LoopView, inflation_ratio: float | None) -> int:
    """Hoists the invariant instructions of one loop's body; returns how many."""
    if not isinstance(loop.instruction.shape, TupleShape):
        return 0
    count = loop_trip_count(loop)
    if count is not None and count <= 1:
        return 0
    body = loop.body
    unhoisted = {g.name for g in invariant_gtes(body) if isinstance(g.shape, ArrayShape)}
    if not unhoisted:
        return 0
    for inst in body:
        if inst.opcode == "domain" or (
            inst.opcode == "custom-call" and inst.attr("custom_call_target") in _BLOCKING_CALLS
        ):
            return 0
    hoisted: dict[str, str] = {}  # body name -> its copy before the loop
    to_replace: list[str] = []
    for inst in body:
        if has_side_effect(inst) or inst.opcode == "parameter" or _inflates(inst, body, inflation_ratio):
            continue

        def invariant(op: str) -> bool:
            return op in hoisted or op in unhoisted or body[op].opcode == "constant"

        if not all(invariant(op) for op in inst.operands):
            continue
        if _not_worth_alone(inst):
            if inst.opcode != "constant":
                unhoisted.add(inst.name)
            continue
        _copy_out(loop, body, inst.name, hoisted, unhoisted)
        to_replace.append(inst.name)
    if not to_replace:
        return 0
    live_in = append_elements(loop, [hoisted[name] for name in to_replace])
    for name, read in zip(to_replace, live_in):
        body.replace_uses(name, read)
    body.remove_dead()
    return len(to_replace)


def _copy_out(loop: LoopView, body: ComputationEdit, name: str, hoisted: dict[str, str], unhoisted: set[str]) -> None:
    """Copies `name` and the operands it needs that are not out yet to before the loop
    (`CreateLoopInvariantCopy`): a read of the body's parameter becomes a read of the loop's init."""
    parent, param = loop.parent, parameter(body).name
    inst = body[name]
    for op in inst.operands:
        if op not in hoisted and op != param:
            _copy_out(loop, body, op, hoisted, unhoisted)
    operands = tuple(loop.init.name if op == param else hoisted[op] for op in inst.operands)
    copy_name = loop.edit.fresh_name(inst.name)
    if inst.opcode == "get-tuple-element" and inst.operands[0] == param:
        init_shape = loop.init.shape
        copy = get_tuple_element(copy_name, loop.init.name, init_shape, inst.attr("index"), like=inst)  # type: ignore[arg-type]
    else:
        copy = dataclasses.replace(inst, name=copy_name, operands=operands)
    parent.add(copy, before=loop.name)
    hoisted[name] = copy_name
    unhoisted.discard(name)

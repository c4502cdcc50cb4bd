"""Constants a While carries unchanged, sunk into its body and condition (XLA's WhileLoopConstantSinking).

For each element the body passes through unchanged (root operand i is `get-tuple-element(param),
index=i`) whose initial value is a constant (or, with `sink_broadcast_of_constants`, a broadcast
of one), every other reader of that get-tuple-element in the body reads a copy of the constant
made inside the body instead, and every get-tuple-element of that index in the condition likewise.
The element itself stays carried (the root still passes it through): `WhileLoopSimplifier` removes
it once nothing reads it.

What that changes for propagation: a carried constant ties the loop's tuple element to whatever
sharding the constant's readers give it, across every iteration; sunk, each reader gets its own
unannotated copy. On Llama steps the RoPE tables and attention-mask fills stop tying the loop
carry to a batch-unsharded layout.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from planner.hlo.ir.module import HloModule, Instruction
from planner.prepare.edit import ComputationEdit, ModuleEdit
from planner.prepare.rewrite import Rewrite
from planner.prepare.while_state import LoopView, gtes_by_index, invariant_gtes, whiles


@dataclass(frozen=True)
class WhileLoopConstantSinking:
    NAME: ClassVar[str] = "while-loop-constant-sinking"
    MIRRORS: ClassVar[str] = "xla/service/while_loop_constant_sinking.cc"

    sink_broadcast_of_constants: bool = False
    sink_only_scalar_constants: bool = False

    def run(self, module: HloModule) -> Rewrite:
        edit = ModuleEdit(module)
        sunk = sum(self._sink(loop) for loop in whiles(edit))
        if not sunk:
            return Rewrite(module)
        return Rewrite(edit.freeze(), summary=f"{sunk} carried constants sunk into loop bodies and conditions")

    def _sink(self, loop: LoopView) -> int:
        init = loop.init
        if init.opcode != "tuple":
            return 0
        parent, body, condition = loop.parent, loop.body, loop.condition
        conditional = gtes_by_index(condition) if condition.parameters else {}
        sunk = 0
        rebuilt: list[str] = []
        for gte in invariant_gtes(body):
            index = gte.attr("index")
            value = parent[init.operands[index]]
            if not self._sinkable(value, parent):
                continue
            readers = [u for u in body.users(gte.name) if u.name != body.root_name]
            if readers or len(body.users(gte.name)) > 1:
                copy = _clone_into(body, value, parent, loop.edit, before=readers[0].name if readers else None)
                body.replace_uses(gte.name, copy, keep=(body.root_name, index))
                sunk += 1
                # XLA sinks into a clone of the body (`<body>.sunk`), made at the first sinking.
                if body.name not in rebuilt:
                    rebuilt.append(body.name)
            for cond_gte in conditional.get(index, []):
                if condition.users(cond_gte.name):
                    first = condition.users(cond_gte.name)[0].name
                    copy = _clone_into(condition, value, parent, loop.edit, before=first)
                    condition.replace_uses(cond_gte.name, copy)
                    sunk += 1
                    if condition.name not in rebuilt:
                        rebuilt.append(condition.name)
        for name in rebuilt:
            loop.edit.recreated(name)
        return sunk

    def _sinkable(self, value: Instruction, parent: ComputationEdit) -> bool:
        is_constant = value.opcode == "constant"
        is_broadcast_of_constant = (
            self.sink_broadcast_of_constants
            and value.opcode == "broadcast"
            and parent[value.operands[0]].opcode == "constant"
        )
        if not (is_constant or is_broadcast_of_constant):
            return False
        return not self.sink_only_scalar_constants or value.shape.leaves()[0].rank == 0


def _clone_into(
    comp: ComputationEdit, value: Instruction, source: ComputationEdit, edit: ModuleEdit, before: str | None
) -> str:
    """A copy of the constant (or broadcast of a constant) `value` inside `comp`, before `before`."""
    if value.opcode == "broadcast":
        operand = _clone_into(comp, source[value.operands[0]], source, edit, before)
        copy = dataclasses.replace(value, name=edit.fresh_name(value.name), operands=(operand,))
    else:
        # XLA clones with the suffix ".sunk" (`constant.53.sunk`, uniquified).
        copy = dataclasses.replace(value, name=edit.fresh_name(f"{value.name}.sunk"))
    comp.add(copy, before=before)
    return copy.name

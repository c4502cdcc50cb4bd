"""Constant expressions copied once per reader (XLA's HloConstantSplitter, as XLA:TPU's partitioner runs it).

Before it propagates, XLA:TPU gives every reader of a constant its own copy, and with
`split_expressions` (libtpu's `--xla_tpu_enable_expression_constant_splitter`) every reader of an
expression built only from constants and iotas through elementwise ops, broadcasts and slices its
own copy of the whole expression. The copies carry no sharding (the newer splitter clears it), so
each takes the sharding its own reader wants: a RoPE table or a causal mask read by two loops is no
longer one value both loops must agree on.

Worked example: `m = compare(iota.1, iota.2)` read by the forward loop's init and the backward
loop's init becomes two compares of two iota pairs, one per init.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from planner.hlo.ir.module import HloModule, Instruction
from planner.hlo.ir.opcodes import ELEMENTWISE
from planner.prepare.edit import ComputationEdit, ModuleEdit, has_side_effect
from planner.prepare.rewrite import Rewrite


def _is_seed(inst: Instruction, split_expressions: bool) -> bool:
    return inst.opcode == "constant" or (split_expressions and inst.opcode == "iota")


def _is_expression(inst: Instruction) -> bool:
    if has_side_effect(inst):
        return False
    return inst.opcode in ELEMENTWISE or inst.opcode in ("broadcast", "slice")


@dataclass(frozen=True)
class HloConstantSplitter:
    NAME: ClassVar[str] = "hlo-constant-splitter"
    MIRRORS: ClassVar[str] = "xla/hlo/transforms/hlo_constant_splitter.cc"

    split_expressions: bool = True

    def run(self, module: HloModule) -> Rewrite:
        edit = ModuleEdit(module)
        copies = sum(self._split(comp, edit) for comp in list(edit.computations.values()))
        if not copies:
            return Rewrite(module)
        return Rewrite(edit.freeze(), summary=f"{copies} constant expressions copied for their readers")

    def _split(self, comp: ComputationEdit, edit: ModuleEdit) -> int:
        members: list[str] = [i.name for i in comp if _is_seed(i, self.split_expressions)]
        in_set = set(members)
        previous = -1
        while len(members) != previous:
            previous = len(members)
            worklist = list(members)
            while worklist:
                name = worklist.pop()
                inst = comp[name]
                if not all(op in in_set for op in inst.operands):
                    continue
                if name not in in_set:
                    in_set.add(name)
                    members.append(name)
                if self.split_expressions:
                    worklist.extend(u.name for u in comp.users(name) if _is_expression(u) and u.name not in in_set)
        copies = 0
        for name in members:
            inst = comp[name]
            readers = comp.users(name)
            if _is_seed(inst, self.split_expressions) and len(readers) <= 1:
                continue
            for reader in readers:
                if inst.opcode == "constant" or reader.name not in in_set:
                    _copy_for(comp, edit, name, reader.name)
                    copies += 1
        return copies


def _copy_for(comp: ComputationEdit, edit: ModuleEdit, name: str, reader: str) -> None:
    """A copy of `name`'s whole expression, placed before `reader`, which reads the copy instead."""
    copies: dict[str, str] = {}

    def copy(n: str) -> str:
        if n not in copies:
            inst = comp[n]
            operands = tuple(copy(o) for o in inst.operands)
            attributes = tuple(a for a in inst.attributes if a.key != "sharding")
            clone = dataclasses.replace(inst, name=edit.fresh_name(inst.name), operands=operands, attributes=attributes)
            comp.add(clone, before=reader)
            copies[n] = clone.name
        return copies[n]

    new = copy(name)
    user = comp[reader]
    comp.set_operands(reader, tuple(new if o == name else o for o in user.operands))

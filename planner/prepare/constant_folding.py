"""Scalar arithmetic on constants folded to a constant (XLA's HloConstantFolding, for scalars).

XLA folds an instruction whose operands are all constants (or broadcasts of constants), at least
one a constant, and never a broadcast or an iota. In XLA:TPU's loop pipeline what this changes is
the scalar index arithmetic the loop-invariant motion hoists (`negate(constant(1))`): folded to a
constant, the carried element it became is sunk back into the body and removed, so the loop's
tuple ends as it would have without the hoist. Non-finite literals fold too: torch_xla guards a
mean's `1/n` with `select(n != 0, 1/n, nan)`, which the loop-invariant motion hoists out of the
scan body; XLA:TPU's `simplification-1.after_constant_folding` folds it (the step's `nan` constants
go), and the constant is sunk back, so the forward loop carries no element for it. Folding arrays
(which XLA also does) changes no loop element in the steps modelled and is not done here: an array
literal is kept as written.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from planner.hlo.ir.module import HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.prepare.edit import ComputationEdit, ModuleEdit
from planner.prepare.rewrite import Rewrite

Number = int | float | bool

_UNARY: dict[str, Callable[[Number], Number]] = {
    "negate": operator.neg,
    "abs": abs,
    "not": lambda x: not x if isinstance(x, bool) else ~int(x),
    "sign": lambda x: (x > 0) - (x < 0),
    "copy": lambda x: x,
}
_BINARY: dict[str, Callable[[Number, Number], Number]] = {
    "add": operator.add,
    "subtract": operator.sub,
    "multiply": operator.mul,
    "maximum": max,
    "minimum": min,
    "and": lambda a, b: a and b if isinstance(a, bool) else int(a) & int(b),
    "or": lambda a, b: a or b if isinstance(a, bool) else int(a) | int(b),
    "xor": lambda a, b: a != b if isinstance(a, bool) else int(a) ^ int(b),
}
_COMPARE: dict[str, Callable[[Number, Number], bool]] = {
    "EQ": operator.eq, "NE": operator.ne, "LT": operator.lt, "LE": operator.le, "GT": operator.gt, "GE": operator.ge,
}  # fmt: skip


def parse_scalar(literal: str, element_type: str) -> Number | None:
    text = literal.strip()
    if element_type == "pred":
        return {"true": True, "false": False}.get(text)
    try:
        if element_type.startswith(("s", "u")):
            return int(text)
        value = float(text)
    except ValueError:
        return None
    return value  # nan and inf too: XLA folds `select(p, x, nan)` like any other


def format_scalar(value: Number, element_type: str) -> str:
    if element_type == "pred":
        return "true" if value else "false"
    if element_type.startswith(("s", "u")):
        return str(int(value))
    f = float(value)
    return str(int(f)) if f.is_integer() and abs(f) < 1e16 else repr(f)


def _evaluate(inst: Instruction, values: list[Number], element_type: str) -> Number | None:
    opcode = inst.opcode
    if opcode in _UNARY and len(values) == 1:
        return _UNARY[opcode](values[0])
    if opcode == "convert" and len(values) == 1:
        return parse_scalar(format_scalar(values[0], element_type), element_type)
    if opcode in _BINARY and len(values) == 2:
        return _BINARY[opcode](values[0], values[1])
    if opcode == "divide" and len(values) == 2 and values[1] != 0:
        if element_type.startswith(("s", "u")):
            return int(values[0] / values[1])  # XLA's integer division truncates toward zero
        return values[0] / values[1]
    if opcode == "compare" and len(values) == 2:
        return _COMPARE[str(inst.attr("direction"))](values[0], values[1])
    if opcode == "select" and len(values) == 3:
        return values[1] if values[0] else values[2]
    return None


def fold_scalar(comp: ComputationEdit, inst: Instruction) -> Number | None:
    """The value of a scalar instruction over constant operands, or None when XLA would not fold it."""
    shape = inst.shape
    if not isinstance(shape, ArrayShape) or shape.rank != 0 or inst.opcode in ("constant", "broadcast", "iota"):
        return None
    if not inst.operands or inst.opcode not in (*_UNARY, *_BINARY, "convert", "divide", "compare", "select"):
        return None
    operands = [comp[o] for o in inst.operands]
    if not all(o.opcode == "constant" for o in operands):
        return None
    values = []
    for o in operands:
        value = parse_scalar(o.literal or "", o.shape.leaves()[0].element_type)
        if value is None:
            return None
        values.append(value)
    return _evaluate(inst, values, shape.element_type)


@dataclass(frozen=True)
class ConstantFolding:
    NAME: ClassVar[str] = "constant_folding"
    MIRRORS: ClassVar[str] = "xla/service/hlo_constant_folding.cc (scalars)"

    def run(self, module: HloModule) -> Rewrite:
        edit = ModuleEdit(module)
        folded = 0
        for comp in edit.computations.values():
            for inst in comp:
                value = fold_scalar(comp, inst)
                if value is None:
                    continue
                element_type = inst.shape.leaves()[0].element_type
                constant = Instruction(edit.fresh_name("constant"), "constant", inst.shape, (),
                                       literal=format_scalar(value, element_type))  # fmt: skip
                comp.add(constant, before=inst.name)
                comp.replace_uses(inst.name, constant.name)
                comp.remove(inst.name)
                folded += 1
        if not folded:
            return Rewrite(module)
        return Rewrite(edit.freeze(), summary=f"{folded} scalar constant expressions folded")

"""A While element of a type the target cannot hold in one register, carried as two elements.

libtpu's `X64_elimination` pipeline rewrites two kinds of values as pairs before anything else
runs: 64-bit integers as two u32 words (`x64-rewriter`) and complex numbers as their real and
imaginary parts (`complex-rewriter`). A While that carried one such element carries its pair as two
adjacent elements from then on, and every later element moves one index up. Both passes share this
edit; each says what its pair is (`ElementPair`): which element types split, the type of each half,
how a value splits into its halves and how the halves rebuild it.

Only the tuple changes: the split value is rebuilt where the loop's body, condition or reader reads
it, and split where the body returns it (and in the init), so the arithmetic stays as the user wrote
it and what partitioning sees is the carried pair.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from planner.hlo.ir.module import Instruction
from planner.hlo.ir.shapes import ArrayShape, TupleShape
from planner.prepare.edit import ComputationEdit, ModuleEdit, get_tuple_element, tuple_of, with_attribute
from planner.prepare.while_state import LoopView, element_of, parameter


class ElementPair(Protocol):
    """How one kind of element splits in two."""

    def splits(self, shape: object) -> bool:
        """Whether an element of `shape` is carried as a pair."""

    def half(self, shape: ArrayShape) -> ArrayShape:
        """The shape of each half of an element of `shape`."""

    def split(self, edit: ModuleEdit, comp: ComputationEdit, value: str, shape: ArrayShape, before: str) -> list[str]:
        """The two halves of `value`, added to `comp` before `before`."""

    def split_init(self, edit: ModuleEdit, comp: ComputationEdit, value: str, shape: ArrayShape,
                   before: str) -> list[str]:  # fmt: skip
        """The two halves of `value` where the loop's init carries it (a constant may split into constants)."""

    def combine(self, name: str, shape: ArrayShape, halves: tuple[str, str]) -> Instruction:
        """The instruction that rebuilds a value of `shape` from its halves, named `name`."""

    def is_combine(self, inst: Instruction) -> bool:
        """Whether `inst` is such a rebuild."""


def split_elements(loop: LoopView, pair: ElementPair) -> int:
    """Splits the loop's elements `pair` splits; returns how many."""
    old = loop.shape
    split = [i for i, e in enumerate(old.elements) if pair.splits(e)]
    if not split:
        return 0
    parent, name = loop.parent, loop.name
    if any(u.opcode != "get-tuple-element" for u in parent.users(name)) or parent.root_name == name:
        return 0  # the loop's result is read whole: its halves would have to be put back together
    for comp in (loop.body, loop.condition):
        if any(u.opcode != "get-tuple-element" for u in comp.users(parameter(comp).name)):
            return 0
    # Old index -> new indices (both halves for a split element).
    where: dict[int, tuple[int, ...]] = {}
    elements: list[ArrayShape] = []
    for i, e in enumerate(old.elements):
        if i in split:
            where[i] = (len(elements), len(elements) + 1)
            elements += [pair.half(e), pair.half(e)]  # type: ignore[arg-type]
        else:
            where[i] = (len(elements),)
            elements.append(e)  # type: ignore[arg-type]
    shape = TupleShape(tuple(elements))
    edit = loop.edit

    # Inside: reads of a split element rebuild it from its halves; the body returns its halves.
    body = loop.body
    root = body.root
    returned = list(root.operands)
    for comp in (body, loop.condition):
        param = parameter(comp)
        comp.replace(dataclasses.replace(param, shape=shape))
        _read_halves(edit, comp, param.name, shape, where, split, pair)
    operands: list[str] = []
    for i, value in enumerate(returned):
        if i not in split:
            operands.append(value)
            continue
        passed = body[value]
        if pair.is_combine(passed) and all(
            body[o].opcode == "get-tuple-element" and body[o].attr("index") == k
            for o, k in zip(passed.operands, where[i])
        ):
            operands += list(passed.operands)  # carried unchanged: its halves pass through
            continue
        operands += pair.split(edit, body, value, old.elements[i], before=root.name)  # type: ignore[arg-type]
    body.set_operands(root.name, tuple(operands))
    body.replace(dataclasses.replace(body[root.name], shape=shape))

    # Outside: the init carries the halves; what reads the result rebuilds the value.
    init = loop.init
    values = []
    for i in range(len(old.elements)):
        value = element_of(edit, parent, init, old, i, before=name)
        if i not in split:
            values.append(value)
        else:
            values += pair.split_init(edit, parent, value, old.elements[i], before=name)  # type: ignore[arg-type]
    init_name = edit.fresh_name("tuple")
    parent.add(tuple_of(init_name, tuple(values), shape.elements), before=name)
    parent.replace(dataclasses.replace(loop.instruction, operands=(init_name,), shape=shape))
    if init.opcode == "tuple" and not parent.has_users(init.name) and init.name != parent.root_name:
        parent.remove(init.name)
    _read_halves(edit, parent, name, shape, where, split, pair)
    edit.recreated(loop.condition.name)
    edit.recreated(loop.body.name)
    return len(split)


def _read_halves(edit: ModuleEdit, comp: ComputationEdit, tuple_name: str, shape: TupleShape,
                 where: dict[int, tuple[int, ...]], split: list[int], pair: ElementPair) -> None:  # fmt: skip
    """Every get-tuple-element of `tuple_name` reads its element's new index; one of a split
    element becomes the pair's rebuild of two reads of its halves (keeping its name, so what reads
    it and what names it find it)."""
    for gte in comp.users(tuple_name):
        index = gte.attr("index")
        if index not in split:
            comp.replace(with_attribute(gte, "index", where[index][0], str(where[index][0])))
            continue
        halves = []
        for k in where[index]:
            half = get_tuple_element(edit.fresh_name("get-tuple-element"), tuple_name, shape, k, like=gte)
            comp.add(half, before=gte.name)
            halves.append(half.name)
        comp.replace(pair.combine(gte.name, gte.array_shape, (halves[0], halves[1])))

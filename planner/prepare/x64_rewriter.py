"""64-bit integers a While carries, carried as two 32-bit halves (libtpu's `x64-rewriter`).

XLA:TPU has no 64-bit integer registers: the first pass of its `X64_elimination` pipeline rewrites
every s64/u64 value as a pair of u32 values (low word, high word), and the pair a While carried as
one `(u32[], u32[])` element is carried flat, as two elements, by the time the simplification
pipeline starts (`Phase_1_pre-layout_assignment_passes.after_hlo-module-dce`). The pass is libtpu's
own; no open-source XLA pass does it (open-source XLA only knows the custom calls
`X64Combine`/`X64SplitLow`/`X64SplitHigh` that stand for the pair, see
`hlo_replication_analysis.cc`). Observed before/after, on the torch_xla scan steps (their loop
counter is `s64[]`):

    before:  while = (s64[], f32[8,32,1024], ...)           init tuple(constant(0), ...)
    after:   while = (u32[], u32[], f32[8,32,1024], ...)     init tuple(constant(0), constant(0), ...)
             condition: s32(high) < 0 or (high == 0 and low < 8), in 32-bit arithmetic

so every element after the counter moves one index up, and a loop with torch_xla's counter carries
one element more than the user's module says. Here the halves are what the While carries, and the
64-bit value is rebuilt where it is read (`X64Combine(low, high)`, which propagation passes through)
and split where the body returns it (`convert` to u32 for the low word, of a logical shift right by
32 for the high one), leaving the integer arithmetic 64-bit: only the tuple changes, which is what
partitioning sees (each half of a scalar is a replicated scalar). A 64-bit value the
simplification pipeline hoists later (the `X64Combine` that rebuilds an RNG state for
`rng-bit-generator`) is carried as the u64 it is, as XLA:TPU carries it. Without this pass
(`--xla_disable_hlo_passes=x64-rewriter`) XLA:TPU's own loops carry the s64 counter as one
element: 38 and 52 elements on the bundled Llama scan step instead of 39 and 53.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from planner.hlo.ir.module import Attribute, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape, TupleShape
from planner.prepare.edit import ComputationEdit, ModuleEdit, get_tuple_element, tuple_of, with_attribute
from planner.prepare.rewrite import Rewrite
from planner.prepare.while_state import LoopView, element_of, parameter, whiles

WIDE = frozenset({"s64", "u64"})


def _half(shape: ArrayShape) -> ArrayShape:
    return dataclasses.replace(shape, element_type="u32")


def _custom_call(name: str, target: str, shape: ArrayShape, operands: tuple[str, ...]) -> Instruction:
    return Instruction(name, "custom-call", shape, operands, (Attribute("custom_call_target", target, f'"{target}"'),))


@dataclass(frozen=True)
class X64Rewriter:
    NAME: ClassVar[str] = "x64-rewriter"
    MIRRORS: ClassVar[str] = (
        "libtpu X64_elimination/x64-rewriter (+ the flattening by hlo-module-dce), by its dump's before/after"
    )

    def run(self, module: HloModule) -> Rewrite:
        edit = ModuleEdit(module)
        split = sum(_split(loop) for loop in whiles(edit))
        if not split:
            return Rewrite(module)
        return Rewrite(edit.freeze(), summary=f"{split} 64-bit loop elements carried as two u32 halves")


def _wide(shape: object) -> bool:
    return isinstance(shape, ArrayShape) and shape.element_type in WIDE


def _split(loop: LoopView) -> int:
    """Splits the loop's 64-bit integer elements; returns how many."""
    old = loop.shape
    wide = [i for i, e in enumerate(old.elements) if _wide(e)]
    if not wide:
        return 0
    parent, name = loop.parent, loop.name
    if any(u.opcode != "get-tuple-element" for u in parent.users(name)) or parent.root_name == name:
        return 0  # the loop's result is read whole: its halves would have to be put back together
    for comp in (loop.body, loop.condition):
        if any(u.opcode != "get-tuple-element" for u in comp.users(parameter(comp).name)):
            return 0
    # Old index -> new indices (low word, then high word for a split element).
    where: dict[int, tuple[int, ...]] = {}
    elements: list[ArrayShape] = []
    for i, e in enumerate(old.elements):
        if i in wide:
            where[i] = (len(elements), len(elements) + 1)
            elements += [_half(e), _half(e)]  # type: ignore[arg-type]
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
        _read_halves(edit, comp, param.name, shape, where, wide)
    operands: list[str] = []
    for i, value in enumerate(returned):
        if i not in wide:
            operands.append(value)
            continue
        passed = body[value]
        if (
            passed.opcode == "custom-call"
            and passed.attr("custom_call_target") == "X64Combine"
            and all(
                body[o].opcode == "get-tuple-element" and body[o].attr("index") == k
                for o, k in zip(passed.operands, where[i])
            )
        ):
            operands += list(passed.operands)  # carried unchanged: its halves pass through
            continue
        operands += _split_words(edit, body, value, old.elements[i], before=root.name)  # type: ignore[arg-type]
    body.set_operands(root.name, tuple(operands))
    body.replace(dataclasses.replace(body[root.name], shape=shape))

    # Outside: the init carries the halves; what reads the result rebuilds the 64-bit value.
    init = loop.init
    values = []
    for i in range(len(old.elements)):
        value = element_of(edit, parent, init, old, i, before=name)
        if i not in wide:
            values.append(value)
        else:
            values += _halves_of(edit, parent, value, old.elements[i], before=name)  # type: ignore[arg-type]
    init_name = edit.fresh_name("tuple")
    parent.add(tuple_of(init_name, tuple(values), shape.elements), before=name)
    parent.replace(dataclasses.replace(loop.instruction, operands=(init_name,), shape=shape))
    if init.opcode == "tuple" and not parent.has_users(init.name) and init.name != parent.root_name:
        parent.remove(init.name)
    _read_halves(edit, parent, name, shape, where, wide)
    edit.recreated(loop.condition.name)
    edit.recreated(loop.body.name)
    return len(wide)


def _read_halves(edit: ModuleEdit, comp: ComputationEdit, tuple_name: str, shape: TupleShape,
                 where: dict[int, tuple[int, ...]], wide: list[int]) -> None:  # fmt: skip
    """Every get-tuple-element of `tuple_name` reads its element's new index; one of a split
    element becomes `X64Combine` of two reads of its halves (keeping its name, so what reads it and
    what names it find it)."""
    for gte in comp.users(tuple_name):
        index = gte.attr("index")
        if index not in wide:
            comp.replace(with_attribute(gte, "index", where[index][0], str(where[index][0])))
            continue
        halves = []
        for k in where[index]:
            half = get_tuple_element(edit.fresh_name("get-tuple-element"), tuple_name, shape, k, like=gte)
            comp.add(half, before=gte.name)
            halves.append(half.name)
        comp.replace(_custom_call(gte.name, "X64Combine", gte.array_shape, tuple(halves)))


def _halves_of(edit: ModuleEdit, comp: ComputationEdit, value: str, shape: ArrayShape, before: str) -> list[str]:
    """The low and high words of `value`: u32 constants for an integer constant, else computed."""
    number = _integer(comp[value])
    if number is None:
        return _split_words(edit, comp, value, shape, before)
    names = []
    for k in range(2):
        word = (number >> (32 * k)) & 0xFFFFFFFF
        half = Instruction(edit.fresh_name("constant"), "constant", _half(shape), (), literal=str(word))
        comp.add(half, before=before)
        names.append(half.name)
    return names


def _split_words(edit: ModuleEdit, comp: ComputationEdit, value: str, shape: ArrayShape, before: str) -> list[str]:
    """`convert(value)` (the low word) and `convert(value >> 32)` (the high word), as u32."""
    low = Instruction(edit.fresh_name("convert"), "convert", _half(shape), (value,))
    comp.add(low, before=before)
    scalar = dataclasses.replace(shape, dims=(), dynamic=(), layout=None)
    amount = Instruction(edit.fresh_name("constant"), "constant", scalar, (), literal="32")
    comp.add(amount, before=before)
    if shape.rank:
        dims = Attribute("dimensions", (), "{}")
        amount = Instruction(edit.fresh_name("broadcast"), "broadcast", shape, (amount.name,), (dims,))
        comp.add(amount, before=before)
    shifted = Instruction(edit.fresh_name("shift-right-logical"), "shift-right-logical", shape, (value, amount.name))
    comp.add(shifted, before=before)
    high = Instruction(edit.fresh_name("convert"), "convert", _half(shape), (shifted.name,))
    comp.add(high, before=before)
    return [low.name, high.name]


def _integer(inst: Instruction) -> int | None:
    if inst.opcode != "constant" or inst.literal is None or not isinstance(inst.shape, ArrayShape):
        return None
    if inst.shape.rank != 0:
        return None
    try:
        return int(inst.literal)
    except ValueError:
        return None

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
from planner.hlo.ir.shapes import ArrayShape
from planner.prepare.edit import ComputationEdit, ModuleEdit
from planner.prepare.element_split import split_elements
from planner.prepare.rewrite import Rewrite
from planner.prepare.while_state import whiles

WIDE = frozenset({"s64", "u64"})


def _half(shape: ArrayShape) -> ArrayShape:
    return dataclasses.replace(shape, element_type="u32")


def _custom_call(name: str, target: str, shape: ArrayShape, operands: tuple[str, ...]) -> Instruction:
    return Instruction(name, "custom-call", shape, operands, (Attribute("custom_call_target", target, f'"{target}"'),))


@dataclass(frozen=True)
class X64Words:
    """An s64/u64 element as its low and high u32 words; `X64Combine(low, high)` rebuilds it."""

    def splits(self, shape: object) -> bool:
        return isinstance(shape, ArrayShape) and shape.element_type in WIDE

    def half(self, shape: ArrayShape) -> ArrayShape:
        return _half(shape)

    def split(self, edit: ModuleEdit, comp: ComputationEdit, value: str, shape: ArrayShape, before: str) -> list[str]:
        return _split_words(edit, comp, value, shape, before)

    def split_init(self, edit: ModuleEdit, comp: ComputationEdit, value: str, shape: ArrayShape,
                   before: str) -> list[str]:  # fmt: skip
        return _halves_of(edit, comp, value, shape, before)

    def combine(self, name: str, shape: ArrayShape, halves: tuple[str, str]) -> Instruction:
        return _custom_call(name, "X64Combine", shape, halves)

    def is_combine(self, inst: Instruction) -> bool:
        return inst.opcode == "custom-call" and inst.attr("custom_call_target") == "X64Combine"


@dataclass(frozen=True)
class X64Rewriter:
    NAME: ClassVar[str] = "x64-rewriter"
    MIRRORS: ClassVar[str] = (
        "libtpu X64_elimination/x64-rewriter (+ the flattening by hlo-module-dce), by its dump's before/after"
    )

    def run(self, module: HloModule) -> Rewrite:
        edit = ModuleEdit(module)
        split = sum(split_elements(loop, X64Words()) for loop in whiles(edit))
        if not split:
            return Rewrite(module)
        return Rewrite(edit.freeze(), summary=f"{split} 64-bit loop elements carried as two u32 halves")


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

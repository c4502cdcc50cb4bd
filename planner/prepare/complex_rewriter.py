"""Complex values a While carries, carried as their real and imaginary parts (libtpu's `complex-rewriter`).

XLA:TPU computes no complex arithmetic: the `X64_elimination` pipeline's `complex-rewriter` rewrites
every c64 (c128) value as a pair of f32 (f64) arrays, its real and imaginary parts, and a While that
carried one complex element carries the pair as two adjacent elements from then on (the same edit as
`x64-rewriter`'s, `element_split`). Observed before/after in XLA:TPU's dump of DeepSeek 2 16B
(`X64_elimination`, files `after_pipeline-start` -> `after_complex-rewriter`): the forward scan's
rotary embedding tables

    before:  while = (..., f32[], f32[], c64[16,1024,16,32], f32[], f32[], c64[16,1024,1,32], s8[1,2,2], ...)
    after:   while = (..., f32[], f32[], f32[16,1024,16,32], f32[16,1024,16,32], f32[], f32[],
                       f32[16,1024,1,32], f32[16,1024,1,32], s8[1,2,2], ...)

so each later element moves up one index per complex element before it. Here the parts are what
the While carries: `real` and `imag` split the value where the init and the body's result hold it,
and `complex(re, im)` rebuilds it where it is read, leaving the arithmetic complex (its per-device
bytes are those of the pair, and the parts are elementwise in the value, so they take its sharding).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from planner.hlo.ir.module import HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.prepare.edit import ComputationEdit, ModuleEdit
from planner.prepare.element_split import split_elements
from planner.prepare.rewrite import Rewrite
from planner.prepare.while_state import whiles

# A complex type -> the real type of each of its parts.
PART = {"c64": "f32", "c128": "f64"}


@dataclass(frozen=True)
class ComplexParts:
    """A complex element as its real and imaginary parts; `complex(re, im)` rebuilds it."""

    def splits(self, shape: object) -> bool:
        return isinstance(shape, ArrayShape) and shape.element_type in PART

    def half(self, shape: ArrayShape) -> ArrayShape:
        return dataclasses.replace(shape, element_type=PART[shape.element_type])

    def split(self, edit: ModuleEdit, comp: ComputationEdit, value: str, shape: ArrayShape, before: str) -> list[str]:
        parts = []
        for opcode in ("real", "imag"):
            part = Instruction(edit.fresh_name(opcode), opcode, self.half(shape), (value,))
            parts.append(comp.add(part, before=before).name)
        return parts

    def split_init(self, edit: ModuleEdit, comp: ComputationEdit, value: str, shape: ArrayShape,
                   before: str) -> list[str]:  # fmt: skip
        return self.split(edit, comp, value, shape, before)

    def combine(self, name: str, shape: ArrayShape, halves: tuple[str, str]) -> Instruction:
        return Instruction(name, "complex", shape, halves)

    def is_combine(self, inst: Instruction) -> bool:
        return inst.opcode == "complex"


@dataclass(frozen=True)
class ComplexRewriter:
    NAME: ClassVar[str] = "complex-rewriter"
    MIRRORS: ClassVar[str] = "libtpu X64_elimination/complex-rewriter, the loop tuples, by its dump's before/after"

    def run(self, module: HloModule) -> Rewrite:
        edit = ModuleEdit(module)
        split = sum(split_elements(loop, ComplexParts()) for loop in whiles(edit))
        if not split:
            return Rewrite(module)
        return Rewrite(edit.freeze(), summary=f"{split} complex loop elements carried as real and imaginary parts")

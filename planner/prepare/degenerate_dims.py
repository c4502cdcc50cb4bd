"""Elementwise work on values that only gained size-1 dims, computed before they gain them.

libtpu 0.0.52 runs `degenerate-dimension-rewriter` in every iteration of `simplification-1`,
between `tpu-reduce-rewriter` and `tpu-broadcast-rewriter`. It computes an elementwise op whose
operands are reshapes that only insert size-1 dims at the shape without them, and reshapes its
result back. The broadcast rewriter after it rebuilds only chains that bottom out in broadcasts
(`broadcast_rewriter`); an op of a plain value keeps the squeezed shape, and when it is a loop
invariant, `while-loop-invariant-code-motion` carries it so. libtpu 0.0.50's pipeline has no pass of
that name (its `tpu-degenerate-dimension-rewriter` squeezes and its broadcast rewriter restores the
op); its steps are prepared without this one (`absent_passes`).

Worked example, MaxText's Llama 3 8B step (v6e-8, fsdp=8): the token positions for RoPE,

    broadcast_in_dim.113 = s32[8,2048,1,1] reshape(data__inputs_position__.1: s32[8,2048])
    convert_element_type.130 = f32[8,2048,1,1] convert(broadcast_in_dim.113)

become `convert = f32[8,2048] convert(data__inputs_position__.1)` and a reshape of it to
f32[8,2048,1,1] (dump 0020 -> 0021); the backward scan's rematerialised copy of that convert is then
hoisted, and the loop carries f32[1,2048] per device, where libtpu 0.0.50 carries f32[1,2048,1,1].
With `--xla_disable_hlo_passes=degenerate-dimension-rewriter` libtpu 0.0.52 still carries f32[1,2048]:
another pass of the fixed point makes the same rewrite when this one does not run (not yet identified),
so this models the net effect of `simplification-1` on such ops, first seen in this pass.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from planner.hlo.ir.module import HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.prepare.edit import ComputationEdit, ModuleEdit
from planner.prepare.elementwise_chain import SAME_DIMS_ELEMENTWISE
from planner.prepare.rewrite import Rewrite

# Chains from these are the broadcast rewriter's: it rebuilds them at the wide rank (`broadcast_rewriter`).
_WIDENED = frozenset({"broadcast", "iota", "constant"})


def _squeezed(dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in dims if d != 1)


@dataclass(frozen=True)
class DegenerateDimensionRewriter:
    NAME: ClassVar[str] = "degenerate-dimension-rewriter"
    MIRRORS: ClassVar[str] = (
        "libtpu 0.0.52's degenerate-dimension-rewriter, where the broadcast rewriter after it does not undo "
        "it: an elementwise op of reshapes that only add size-1 dims, computed before them (dump 0020 -> 0021)"
    )

    def run(self, module: HloModule) -> Rewrite:
        edit = ModuleEdit(module)
        renamed: dict[str, str] = {}
        for comp in edit.computations.values():
            for inst in comp:
                if inst.opcode in SAME_DIMS_ELEMENTWISE:
                    value = _rewrite(edit, comp, inst)
                    if value is not None:
                        renamed[inst.name] = value
        if not renamed:
            return Rewrite(module)
        return Rewrite(edit.freeze(), renamed, f"{len(renamed)} elementwise ops computed without their size-1 dims")


def _plain_source(comp: ComputationEdit, name: str, squeezed: tuple[int, ...]) -> str | None:
    """The value a reshape that only adds size-1 dims reads, when it has the squeezed dims; else None."""
    reshape = comp[name]
    if reshape.opcode != "reshape" or reshape.sharding is not None:
        return None
    source = comp[reshape.operands[0]]
    shape = source.shape
    if not isinstance(shape, ArrayShape) or shape.dims != squeezed or source.opcode in _WIDENED:
        return None
    return source.name


def _rewrite(edit: ModuleEdit, comp: ComputationEdit, inst: Instruction) -> str | None:
    shape = inst.shape
    if not isinstance(shape, ArrayShape) or inst.sharding is not None or 1 not in shape.dims:
        return None
    squeezed = _squeezed(shape.dims)
    sources = [_plain_source(comp, o, squeezed) for o in inst.operands]
    if not inst.operands or any(s is None for s in sources):
        return None
    narrow = dataclasses.replace(inst, name=edit.fresh_name(inst.opcode),
                                 shape=ArrayShape(shape.element_type, squeezed),
                                 operands=tuple(s for s in sources if s is not None))  # fmt: skip
    added = comp.add(narrow, before=inst.name)
    meta = tuple(a for a in inst.attributes if a.key == "metadata")
    back = comp.add(Instruction(edit.fresh_name("reshape"), "reshape", shape, (added.name,), meta), before=inst.name)
    comp.replace_uses(inst.name, back.name)
    comp.remove(inst.name)
    return back.name

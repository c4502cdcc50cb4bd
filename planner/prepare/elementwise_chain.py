"""Chains of elementwise work down to the values they start from, which XLA:TPU's rewriters move as one.

`tpu-broadcast-rewriter` (a reshape or a transpose of such a chain) and libtpu 0.0.52's
degenerate-dimension rewrite read the same kind of chain: elementwise ops whose operands all have the
result's dims, walked from the top down to leaves the rewrite knows how to move.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.hlo.ir.module import Instruction
from planner.hlo.ir.opcodes import ELEMENTWISE
from planner.hlo.ir.shapes import ArrayShape
from planner.prepare.edit import ComputationEdit

# Elementwise ops whose operands all have the result's dims (clamp's scalar bounds and the
# bit-width-changing bitcast-convert aside).
SAME_DIMS_ELEMENTWISE = ELEMENTWISE - {"clamp", "bitcast-convert", "stochastic-convert"}


def elementwise_chain(
    comp: ComputationEdit, top: Instruction, dims: tuple[int, ...], is_leaf: Callable[[Instruction], bool]
) -> list[Instruction] | None:
    """The elementwise ops under `top` (itself included) down to leaves, every one of `dims` and without
    a sharding annotation, operands first; None when any path reaches anything else."""
    order: list[Instruction] = []
    seen: set[str] = set()

    def visit(inst: Instruction) -> bool:
        if inst.name in seen:
            return True
        seen.add(inst.name)
        if not isinstance(inst.shape, ArrayShape) or inst.shape.dims != dims or inst.sharding is not None:
            return False
        if is_leaf(inst):
            order.append(inst)
            return True
        if inst.opcode not in SAME_DIMS_ELEMENTWISE or not all(visit(comp[o]) for o in inst.operands):
            return False
        order.append(inst)
        return True

    return order if visit(top) else None

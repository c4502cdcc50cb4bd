"""AlgebraicSimplifier's `transpose(dot(a, b)) -> dot(b, a)`, the form XLA:TPU's dots take (`HandleTranspose`).

XLA:TPU's simplifier supports non-canonical dots (`supports_non_canonical_dots`), so it folds a
transpose into the dot it reads whenever the permutation only puts `b`'s free dims before `a`'s
(batch dims staying in front): the dot is rebuilt with its operands swapped, contracting dims
swapped with them, and the transpose's shape. JAX writes each weight gradient of a dense layer so,
`transpose(dot_general(dy, w))`.

What this changes for propagation is the order of the dot's operands, and through it the order the
compiler walks a loop body in (`MakeInstructionPostOrder` visits operand 0 first): Shardy's round
trip captures a loop's pass-through weights in that order, and so lays out the loop's elements.

Worked example (a Qwen3 backward scan body, measured on XLA:TPU's `simplification-1.after_algsimp`
dump): `dot_general.75 = bf16[8,2048,4096] dot(mul.262, w), lhs_contracting_dims={2},
rhs_contracting_dims={1}` with `w: bf16[4096,12288]`, read only by `transpose.35 =
bf16[4096,8,2048] transpose(dot_general.75), dimensions={2,0,1}`. No batch dims; `w` has one free
dim, which the transpose puts first (dims[0] == 2, the dot's dim after `mul.262`'s two free dims),
then `mul.262`'s two (dims[1:] == {0,1}). XLA:TPU makes it `dot.9 = bf16[4096,8,2048] dot(w,
mul.262), lhs_contracting_dims={1}, rhs_contracting_dims={2}` (here it keeps the name `transpose.35`):
`w` is read before `mul.262`, and the loop captures its weight first.
"""

from __future__ import annotations

from planner.hlo.ir.attributes import Raw
from planner.hlo.ir.frontend_attributes import FrontendAttributes
from planner.hlo.ir.module import Attribute, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.prepare.edit import ComputationEdit

_DIMS = ("lhs_batch_dims", "rhs_batch_dims", "lhs_contracting_dims", "rhs_contracting_dims")


def transpose_of_dot(comp: ComputationEdit, transpose: Instruction) -> bool:
    """Whether `transpose` was rewritten as the swapped dot, in place: it applies when the transpose
    reads a dot nothing else reads and permutes its dims as `dot(b, a)` orders them. The swapped dot
    keeps the transpose's name (the value the module had under it; XLA names it afresh) and the old
    dot goes."""
    dot = comp[transpose.operands[0]]
    if _sdy_sharded(transpose) or _sdy_sharded(dot):
        return False  # a sharding the user wrote in Shardy's spelling stays on the value it names
    if dot.opcode != "dot" or len(dot.operands) != 2 or len(comp.users(dot.name)) != 1 or dot.sharding is not None:
        return False
    shape = transpose.shape
    if not isinstance(shape, ArrayShape):
        return False
    lhs, rhs = (comp[o].shape for o in dot.operands)
    assert isinstance(lhs, ArrayShape) and isinstance(rhs, ArrayShape)
    lb, rb, lc, rc = (tuple(dot.attr(key, ()) or ()) for key in _DIMS)
    perm = tuple(transpose.attr("dimensions") or ())
    batch = len(lb)
    lhs_free = lhs.rank - batch - len(lc)
    rhs_free = rhs.rank - batch - len(rc)
    # Batch dims stay in front (in any order), then `b`'s free dims, then `a`'s.
    if any(p >= batch for p in perm[:batch]):
        return False
    if perm[batch : batch + rhs_free] != tuple(range(batch + lhs_free, batch + lhs_free + rhs_free)):
        return False
    if perm[batch + rhs_free :] != tuple(range(batch, batch + lhs_free)):
        return False
    dims = {
        "lhs_batch_dims": tuple(rb[p] for p in perm[:batch]),
        "rhs_batch_dims": tuple(lb[p] for p in perm[:batch]),
        "lhs_contracting_dims": rc,
        "rhs_contracting_dims": lc,
    }
    attrs: list[Attribute] = [_int_list(key, values) for key, values in dims.items() if values]
    for a in dot.attributes:
        if a.key in _DIMS:
            continue
        attrs.append(_swapped(a) if a.key == "operand_precision" else a)
    comp.replace(Instruction(transpose.name, "dot", shape, (dot.operands[1], dot.operands[0]), tuple(attrs)))
    comp.remove(dot.name)
    return True


def _sdy_sharded(inst: Instruction) -> bool:
    attributes = inst.attr("frontend_attributes")
    return isinstance(attributes, FrontendAttributes) and attributes.get("xla.sdy.sharding") is not None


def _int_list(key: str, values: tuple[int, ...]) -> Attribute:
    return Attribute(key, values, "{" + ",".join(str(v) for v in values) + "}")


def _swapped(precision: Attribute) -> Attribute:
    """`SwapOperandsInDotPrecisionConfig`: the operands' precisions follow their operands."""
    parts = precision.text.strip("{}").split(",")
    if len(parts) != 2:
        return precision
    text = "{" + parts[1] + "," + parts[0] + "}"
    return Attribute(precision.key, Raw(text), text)

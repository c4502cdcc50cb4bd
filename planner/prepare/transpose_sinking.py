"""`tpu-broadcast-rewriter`'s transposes: a transpose of elementwise work on broadcasts and dots,
computed in the transpose's dim order, with the transpose moved onto each dot.

libtpu's `tpu-broadcast-rewriter` treats a transpose as it treats a reshape that only inserts or
deletes size-1 dims (`broadcast_rewriter`): it pushes it up through the elementwise ops it reads,
rebuilding each broadcast with its dims permuted, one copy of the ops per transpose (the originals
stay for their other readers). Where a reshape's chain must end in broadcasts, a transpose's may also
end in dots: each dot is then read through a transpose of its own, which algsimp folds into the dot
(`transpose_of_dot`), so the transpose costs nothing. Any other leaf (a reshape, a
get-tuple-element, a custom call, a concatenate) leaves the transpose where it is.

Evidence (XLA:TPU's `simplification-1` dumps, before and after the pass, of Qwen3 8B on v6e-8 and
Gemma 2 2B on v5e-8, libtpu 0.0.52): of the transposes of an elementwise op, the pass moved exactly
those whose chain ends in broadcasts and dots only (Qwen3: 9 moved, 9 kept; Gemma 2: 17 moved, 12
kept; Llama 3 8B has none of the first kind and 8 of the second, all kept). The backward scan's MLP
weight gradient, for one,

    add_any.14 = bf16[8,2048,4096] add(dot_general.75, dot_general.77)
    transpose.69 = bf16[4096,8,2048] transpose(add_any.14), dimensions={2,0,1}
  becomes
    transpose.35 = bf16[4096,8,2048] transpose(dot_general.75), dimensions={2,0,1}
    transpose.36 = bf16[4096,8,2048] transpose(dot_general.77), dimensions={2,0,1}
    add = bf16[4096,8,2048] add(transpose.35, transpose.36)
  and algsimp then makes each transposed dot one that reads the weight first. A broadcast in the
  chain is rebuilt in the new order: the RMS norm's `broadcast(rsqrt, dims={0,1,2})` of
  `f32[8,2048,32,128]` under `dimensions={3,0,1,2}` becomes `broadcast(rsqrt, dims={1,2,3})` of
  `f32[128,8,2048,32]` (old dim d is new dim `inverse[d]`, here 0->1, 1->2, 2->3, 3->0).
"""

from __future__ import annotations

import dataclasses

from planner.hlo.ir.module import Attribute, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.prepare.edit import ComputationEdit, ModuleEdit
from planner.prepare.elementwise_chain import SAME_DIMS_ELEMENTWISE, elementwise_chain

# What a chain may end in: values the transpose moves onto for free.
_LEAVES = frozenset({"broadcast", "iota", "dot"})


def sink_transpose(edit: ModuleEdit, comp: ComputationEdit, transpose: Instruction) -> str | None:
    """The value now standing for `transpose` once moved onto its chain's leaves, or None where the
    pass leaves it (its operand is no elementwise chain ending in broadcasts, iotas and dots)."""
    shape = transpose.shape
    top = comp[transpose.operands[0]]
    if not isinstance(shape, ArrayShape) or transpose.sharding is not None or top.opcode not in SAME_DIMS_ELEMENTWISE:
        return None
    perm = tuple(transpose.attr("dimensions") or ())
    if perm == tuple(range(len(perm))):
        return None
    chain = elementwise_chain(comp, top, top.shape.dims, lambda inst: inst.opcode in _LEAVES)  # type: ignore[union-attr]
    if chain is None:
        return None
    inverse = {old: new for new, old in enumerate(perm)}
    for inst in chain:
        order = [inverse[d] for d in inst.attr("dimensions") or ()] if inst.opcode == "broadcast" else []
        if order != sorted(order):
            return None  # a broadcast that would transpose its operand: not seen in a dump
    new: dict[str, str] = {}
    for inst in chain:
        out = ArrayShape(inst.shape.element_type, shape.dims)  # type: ignore[union-attr]
        if inst.opcode == "dot":
            moved = Instruction(edit.fresh_name("transpose"), "transpose", out, (inst.name,),
                                (_int_list("dimensions", perm),))  # fmt: skip
        elif inst.opcode == "broadcast":
            dims = tuple(inverse[d] for d in inst.attr("dimensions") or ())
            moved = _with(edit, inst, out, "dimensions", _int_list("dimensions", dims), inst.operands)
        elif inst.opcode == "iota":
            dim = inverse[int(inst.attr("iota_dimension") or 0)]
            moved = _with(edit, inst, out, "iota_dimension", Attribute("iota_dimension", dim, str(dim)), ())
        else:
            moved = dataclasses.replace(inst, name=edit.fresh_name(inst.opcode), shape=out,
                                        operands=tuple(new[o] for o in inst.operands))  # fmt: skip
        new[inst.name] = comp.add(moved, before=transpose.name).name
    comp.replace_uses(transpose.name, new[top.name])
    comp.remove(transpose.name)
    return new[top.name]


def _with(edit: ModuleEdit, inst: Instruction, out: ArrayShape, key: str, attr: Attribute,
          operands: tuple[str, ...]) -> Instruction:  # fmt: skip
    attrs = tuple(attr if a.key == key else a for a in inst.attributes)
    if not inst.has_attr(key):
        attrs = (attr, *attrs)
    return dataclasses.replace(inst, name=edit.fresh_name(inst.opcode), shape=out, operands=operands, attributes=attrs)


def _int_list(key: str, values: tuple[int, ...]) -> Attribute:
    return Attribute(key, values, "{" + ",".join(str(v) for v in values) + "}")

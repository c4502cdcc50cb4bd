"""A reshape of elementwise work on broadcasts, computed at the reshape's shape, as XLA:TPU leaves it.

libtpu runs two closed-source passes in every iteration of `simplification-1`:
`tpu-degenerate-dimension-rewriter` recomputes elementwise ops that have size-1 dims in the squeezed
shape (a reshape back for each non-elementwise reader), and `tpu-broadcast-rewriter` pushes a
reshape that only inserts or deletes size-1 dims up through the elementwise ops it reads, rebuilding
each broadcast of their operands at the new rank, one copy of the ops per reshape. The two undo each
other every iteration (the fixed point stops at its 25-iteration limit); what the partitioner
receives is the second's form, then algsimp, CSE and DCE. Modelled here is the part of that net
effect that changes what propagation decides: a reshape that only inserts or deletes size-1 dims,
of an elementwise op whose elementwise operands bottom out in broadcasts (and iotas) only, becomes
the same elementwise work computed at the reshape's shape from the broadcasts rebuilt at that rank.
The elementwise ops are copied for the reshape, not moved: the originals stay for their other
readers.

Evidence (XLA:TPU dumps of two MoE steps with `--dump-all`): the top-k one-hot a scan stacks,

    compare.19 = pred[8,512,2,4] compare(broadcast(idx, dims={0,1,2}), broadcast(experts, dims={3}))
    convert.3  = f32[8,512,2,4] convert(compare.19)            (compare.19 also read by a select)
    reshape.207 = f32[1,8,512,2,4] reshape(convert.3)          -> dynamic-update-slice of the carry
  becomes (tied MoE LM step, `tpu-broadcast-rewriter`, file 0077 -> 0078; the same on the untied
  step, 0112 -> 0113, and so into the partitioner)
    broadcast.543 = s32[1,8,512,2,4] broadcast(idx, dims={1,2,3})
    broadcast.545 = s32[1,8,512,2,4] broadcast(experts, dims={4})
    compare.25 = pred[1,8,512,2,4] compare(broadcast.543, broadcast.545)
    convert.4  = f32[1,8,512,2,4] convert(compare.25)          -> dynamic-update-slice
  while compare.19 stays for the select. What changes for propagation: the stacked one-hot no
  longer shares its compare (and so its sharding) with the select of the routing weights, and the
  carry takes the batch split of the top-k indices instead of the expert split (per device
  f32[4,1,512,2,4], not f32[4,8,512,2,2]; on the untied step f32[4,8,256,4], not f32[4,2,256,8]).
  This one rewrite, made by hand in XLA's own module before the pass, gives every While element
  XLA's shape on both steps; the module before it does not. No module a cached reference recorded
  as XLA:TPU's input to propagation still has a reshape of this form; the planner's, without this
  pass, have up to 7 per step (RoPE tables, attention masks, MoE one-hots; none on GPT-2 and MLP).

Not modelled (no step measured needs it): the pair also pushes such reshapes through converts and
concatenates down to reduces and reshapes (chains of size-1 dims the first pass squeezes and the
second restores; `simplification-2`'s reshape-mover later moves some back), and
`tpu-broadcast-rewriter` folds `reshape(dot(x, w))` that splits the dot's last dim into a dot with a
reshaped weight (`dot(x, reshape(transpose(w)))` with output [B,S,H,hd], for q/k projections whose
dot has that reshape as only reader; modelled, it changes no While shape on the cached steps).
XLA leaves the reshape where it is when the chain reaches a dot, a get-tuple-element or a slice.

The pass moves transposes the same way, and further: a transpose's chain may also end in dots, which
then read through a transpose of their own (`transpose_sinking`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from planner.hlo.ir.module import Attribute, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.prepare.edit import ComputationEdit, ModuleEdit
from planner.prepare.elementwise_chain import SAME_DIMS_ELEMENTWISE, elementwise_chain
from planner.prepare.rewrite import Rewrite
from planner.prepare.transpose_sinking import sink_transpose


def _array(inst: Instruction) -> ArrayShape | None:
    return inst.shape if isinstance(inst.shape, ArrayShape) else None


def _squeezed(dims: tuple[int, ...]) -> list[int]:
    return [d for d in dims if d != 1]


def _kept_dims(dims: tuple[int, ...]) -> list[int]:
    """Positions of the dims that are not size 1, in order."""
    return [k for k, d in enumerate(dims) if d != 1]


def _int_list(key: str, values: tuple[int, ...]) -> Attribute:
    return Attribute(key, values, "{" + ",".join(str(v) for v in values) + "}")


@dataclass(frozen=True)
class TpuBroadcastRewriter:
    NAME: ClassVar[str] = "tpu-broadcast-rewriter"
    MIRRORS: ClassVar[str] = (
        "libtpu's tpu-broadcast-rewriter with tpu-degenerate-dimension-rewriter, net effect as "
        "simplification-1 leaves it, observed before/after in the dumps of two MoE steps"
    )

    def run(self, module: HloModule) -> Rewrite:
        edit = ModuleEdit(module)
        renamed: dict[str, str] = {}
        transposes: dict[str, str] = {}
        for comp in edit.computations.values():
            for inst in comp:
                if inst.opcode == "reshape" and inst.name in comp:
                    value = _rewrite(edit, comp, inst)
                    if value is not None:
                        renamed[inst.name] = value
                elif inst.opcode == "transpose" and inst.name in comp:
                    value = sink_transpose(edit, comp, inst)
                    if value is not None:
                        transposes[inst.name] = value
        if not (renamed or transposes):
            return Rewrite(module)
        reshapes = f"{len(renamed)} reshapes of elementwise work on broadcasts computed at the reshape's shape"
        moved = f"{len(transposes)} transposes moved onto the dots and broadcasts they read"
        summary = "; ".join(text for text, done in ((reshapes, renamed), (moved, transposes)) if done)
        return Rewrite(edit.freeze(), renamed | transposes, summary)


def _broadcast_leaf(dims: tuple[int, ...]) -> Callable[[Instruction], bool]:
    """A chain's leaves here: broadcasts, and iotas along a dim that is not size 1."""
    return lambda inst: (
        inst.opcode == "broadcast" or (inst.opcode == "iota" and dims[int(inst.attr("iota_dimension") or 0)] != 1)
    )


def _rewrite(edit: ModuleEdit, comp: ComputationEdit, reshape: Instruction) -> str | None:
    shape = _array(reshape)
    top = comp[reshape.operands[0]]
    source = _array(top)
    if shape is None or source is None or reshape.sharding is not None or top.opcode not in SAME_DIMS_ELEMENTWISE:
        return None
    if shape.dims == source.dims or _squeezed(shape.dims) != _squeezed(source.dims):
        return None  # not a reshape that only inserts or deletes size-1 dims
    chain = elementwise_chain(comp, top, source.dims, _broadcast_leaf(source.dims))
    if chain is None:
        return None
    # Source dim -> new dim, for the dims that are not size 1 (the same sequence on both sides).
    to_new = dict(zip(_kept_dims(source.dims), _kept_dims(shape.dims), strict=True))
    new: dict[str, str] = {}
    for inst in chain:
        out = ArrayShape(_array(inst).element_type, shape.dims)  # type: ignore[union-attr]
        if inst.opcode == "broadcast":
            value = _broadcast(edit, comp, reshape, inst, out, to_new)
        elif inst.opcode == "iota":
            value = _iota(edit, comp, reshape, inst, out, to_new)
        else:
            rebuilt = dataclasses.replace(inst, name=edit.fresh_name(inst.opcode), shape=out,
                                          operands=tuple(new[o] for o in inst.operands))  # fmt: skip
            value = comp.add(rebuilt, before=reshape.name).name
        new[inst.name] = value
    comp.replace_uses(reshape.name, new[top.name])
    comp.remove(reshape.name)
    return new[top.name]


def _broadcast(edit: ModuleEdit, comp: ComputationEdit, at: Instruction, inst: Instruction, out: ArrayShape,
               to_new: dict[int, int]) -> str:  # fmt: skip
    """`inst` (a broadcast) at the new rank: its operand's dims that are not size 1 keep their
    result dims, its size-1 dims are reshaped away first."""
    operand = comp[inst.operands[0]]
    operand_shape = _array(operand)
    assert operand_shape is not None
    dims = tuple(inst.attr("dimensions") or ())
    kept = [k for k, d in enumerate(operand_shape.dims) if d != 1]
    name = operand.name
    if len(kept) != operand_shape.rank:
        squeezed = ArrayShape(operand_shape.element_type, tuple(operand_shape.dims[k] for k in kept))
        meta = tuple(a for a in inst.attributes if a.key == "metadata")
        name = comp.add(Instruction(edit.fresh_name("reshape"), "reshape", squeezed, (name,), meta),
                        before=at.name).name  # fmt: skip
    new_dims = tuple(to_new[dims[k]] for k in kept)
    attrs = tuple(_int_list("dimensions", new_dims) if a.key == "dimensions" else a for a in inst.attributes)
    if not inst.has_attr("dimensions"):
        attrs = (_int_list("dimensions", new_dims), *attrs)
    rebuilt = dataclasses.replace(inst, name=edit.fresh_name("broadcast"), shape=out, operands=(name,),
                                  attributes=attrs)  # fmt: skip
    return comp.add(rebuilt, before=at.name).name


def _iota(edit: ModuleEdit, comp: ComputationEdit, at: Instruction, inst: Instruction, out: ArrayShape,
          to_new: dict[int, int]) -> str:  # fmt: skip
    dim = int(inst.attr("iota_dimension") or 0)
    new_dim = to_new[dim]  # `_chain` takes iotas along a dim that is not size 1 only
    attrs = tuple(
        Attribute("iota_dimension", new_dim, str(new_dim)) if a.key == "iota_dimension" else a for a in inst.attributes
    )
    rebuilt = dataclasses.replace(inst, name=edit.fresh_name("iota"), shape=out, attributes=attrs)
    return comp.add(rebuilt, before=at.name).name

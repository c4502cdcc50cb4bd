"""The rewrites of XLA's AlgebraicSimplifier that change what sharding propagation does.

XLA:TPU runs `algsimp` many times before it partitions. Most of its rewrites leave propagation's
decisions where they were; these do not, because propagation treats the opcodes differently:
- a `broadcast` that only inserts size-1 dims (its dims in order, as many elements out as in) is a
  `reshape` (`AlgebraicSimplifierVisitor::HandleBroadcast`). Propagation moves a sharding forward
  through a broadcast only at its last aggressiveness level, through a reshape from the first: on a
  torch_xla scan step the per-layer gradient torch_xla unsqueezes with a broadcast hands its
  sharding to the stacked gradient three levels early;
- ops that change nothing are their operand: a broadcast or reshape to the operand's own shape, a
  convert to the operand's own type, a copy, a transpose that keeps the dim order, a slice of the
  whole operand. Each was a step propagation had to cross.
- a reshape of a reshape is one reshape.
- a slice that lies within one operand of a concatenate reads that operand (`HandleSlice`, "concat
  -> slice to an operand of concat"): the operand itself when the slice takes all of it, else a
  slice of it. torch_xla's scan step re-stacks the per-layer weights in the backward body
  (`concatenate` of eight `reshape(weight_k)`) and `shard_alike`s layer 0's slice of that stack:
  read through, the stack is dead, the loop carries the unstacked weights the annotation reads
  (as XLA:TPU's does, `simplification-1.after_algsimp` on the bundled Llama scan step), and the
  loop-invariant motion no longer hoists the stack into seven stacked carried elements (which
  XLA:TPU's backward loop does carry with `--xla_disable_hlo_passes=algsimp`: 51 elements, and
  380,498,752 B per chip instead of 207,877,152);
- `x * 1` and `1 * x` (a constant of ones, or a broadcast of one) are `x` (`HandleMultiply`).
  torch_xla scales by `constant(1)` everywhere (on the bundled Llama step the module's multiplies
  go from 113 to 61 in `simplification-1`'s first algsimp); kept, each is a buffer the memory model
  counts (that step's model: 287.1 MB with them, 246.5 MB without; 239.7 MB on XLA:TPU's own
  pre-propagation module), and a scalar one in a loop body is invariant work the loop-invariant
  motion carries out of it.
- a subtraction of a constant is an addition of its negation (`HandleSubtract`:
  `A - C => A + negate(C)`, C a constant or a broadcast of one, A not a constant). What this changes
  for propagation is the loops: a reversed scan's index `(n - i) - 1` becomes
  `(n - i) + negate(1)`, and `negate(1)` is loop-invariant work the loop-invariant motion hoists
  (constant folding, constant sinking and the loop simplifier then take it out again), so XLA:TPU
  rebuilds the backward scan, and every loop around it, once more than the planner did: that
  decides the order propagation visits the loops in (the computation list, rebuilt ones last).
- with `dot_to_multiply` (`enable_dot_to_multiply_rewrite`): a dot with no contracting dims is the
  multiply of its operands broadcast to its shape (`HandleDot`). XLA:TPU's `simplification-1`
  algsimp leaves such dots alone (an MoE step's `bsed,bse->bsd` gradient dot survives its 25
  iterations); the `algsimp` `Phase_1_pre-layout_assignment_passes` runs right after it rewrites
  them, before the partitioner. Propagation then sees an elementwise multiply of two broadcasts
  instead of a dot's batch-dim rules.
- a transpose of a dot that only puts the rhs's free dims first is the dot with its operands
  swapped (`HandleTranspose`; `transpose_of_dot.py` says what that changes);
- a dot one of whose operands has only batch and contracting dims is a reduce of a multiply
  (`enable_dot_strength_reduction`, on in `simplification-1`'s algsimp): on an MoE step the
  `bsd,bsed->bse` router-gradient dot is rewritten by `simplification-1`'s first algsimp.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import ClassVar

from planner.hlo.ir.attributes import ComputationRefs, SliceDim
from planner.hlo.ir.module import Attribute, Computation, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.prepare.constant_folding import parse_scalar
from planner.prepare.edit import ComputationEdit, ModuleEdit
from planner.prepare.rewrite import Rewrite
from planner.prepare.transpose_of_dot import transpose_of_dot


def _array(inst: Instruction) -> ArrayShape | None:
    return inst.shape if isinstance(inst.shape, ArrayShape) else None


def _same_array(a: ArrayShape, b: ArrayShape) -> bool:
    return a.element_type == b.element_type and a.dims == b.dims


def _identity(comp: ComputationEdit, inst: Instruction) -> bool:
    """The instruction returns its operand unchanged."""
    shape = _array(inst)
    if shape is None or not inst.operands:
        return False
    operand = _array(comp[inst.operands[0]])
    if operand is None or not _same_array(shape, operand):
        return False
    if inst.opcode in ("broadcast", "reshape", "convert", "copy", "bitcast"):
        return True
    if inst.opcode == "transpose":
        return tuple(inst.attr("dimensions") or ()) == tuple(range(shape.rank))
    # A slice with the same dims in and out takes the whole operand.
    return inst.opcode == "slice"


def _same_shape(comp: ComputationEdit, inst: Instruction, other: str) -> bool:
    """`ReplaceInstructionIfCompatible`: only a value of the very same shape replaces an instruction."""
    a, b = _array(inst), _array(comp[other])
    return a is not None and b is not None and _same_array(a, b)


def _broadcast_is_reshape(comp: ComputationEdit, inst: Instruction) -> bool:
    shape, operand = _array(inst), _array(comp[inst.operands[0]])
    if shape is None or operand is None:
        return False
    dims = tuple(inst.attr("dimensions") or ())
    return list(dims) == sorted(dims) and shape.num_elements == operand.num_elements


def _unannotated_reshape(inst: Instruction) -> bool:
    return inst.opcode == "reshape" and inst.sharding is None


def _subtract_of_constant(edit: ModuleEdit, comp: ComputationEdit, inst: Instruction) -> str | None:
    """`A - C => A + (-C)` (`AlgebraicSimplifierVisitor::HandleSubtract`): C is a scalar constant, or a
    broadcast of one (negated, then broadcast again), and A is not a constant; `A - 0` is `A`, which
    HandleSubtract returns first. Returns the name that now holds the difference.

    XLA rewrites array constants too; their negation is then folded by constant folding, which the
    planner does for scalars only, so an array constant's subtraction is left as it is (the same
    value, and the same propagation: its operand is a constant either way)."""
    shape = _array(inst)
    lhs, rhs = (comp[o] for o in inst.operands)
    if shape is None or lhs.opcode == "constant":
        return None
    broadcast = rhs if rhs.opcode == "broadcast" else None
    constant = comp[rhs.operands[0]] if broadcast is not None else rhs
    if constant.opcode != "constant" or constant.shape.leaves()[0].rank != 0:
        return None
    if parse_scalar(constant.literal or "", constant.shape.leaves()[0].element_type) == 0:
        return lhs.name
    negate = Instruction(edit.fresh_name("negate"), "negate", constant.shape, (constant.name,))
    comp.add(negate, before=inst.name)
    negative = negate.name
    if broadcast is not None:
        dims = tuple(a for a in broadcast.attributes if a.key == "dimensions")
        again = dataclasses.replace(broadcast, name=edit.fresh_name("broadcast"), operands=(negative,), attributes=dims)
        comp.add(again, before=inst.name)
        negative = again.name
    add = Instruction(edit.fresh_name("add"), "add", shape, (lhs.name, negative))
    comp.add(add, before=inst.name)
    return add.name


def _dot_strength_reduction(edit: ModuleEdit, comp: ComputationEdit, dot: Instruction, to_multiply: bool,
                            adders: dict[str, str]) -> str | None:  # fmt: skip
    """`HandleDot`'s two strength reductions; returns the name now holding the dot's value, or None.

    - `enable_dot_to_multiply_rewrite` (`to_multiply`): no contracting dims, the dot is
      `mul(broadcast(transpose(x)), broadcast(transpose(y)))`;
    - `enable_dot_strength_reduction`: one operand has only batch and contracting dims, the dot is
      `reduce(mul(broadcast(transpose(x)), broadcast(transpose(y))))` over the contracting dims,
      in f32 for floats, with a `scalar_add_computation` (`adders` caches one per type, as the
      visitor does)."""
    shape = _array(dot)
    if shape is None or len(dot.operands) != 2 or "PACKED_NIBBLE" in str(dot.attr("operand_precision") or ""):
        return None
    lhs, rhs = (comp[o] for o in dot.operands)
    lhs_shape, rhs_shape = _array(lhs), _array(rhs)
    if lhs_shape is None or rhs_shape is None:
        return None
    lb = tuple(dot.attr("lhs_batch_dims", ()) or ())
    rb = tuple(dot.attr("rhs_batch_dims", ()) or ())
    lc = tuple(dot.attr("lhs_contracting_dims", ()) or ())
    rc = tuple(dot.attr("rhs_contracting_dims", ()) or ())
    multiply_only = not lc
    if multiply_only and not to_multiply:
        return None
    if not multiply_only and not (len(lb) + len(lc) == lhs_shape.rank or len(rb) + len(rc) == rhs_shape.rank):
        return None
    metadata = tuple(a for a in dot.attributes if a.key == "metadata")

    def add(opcode: str, out: ArrayShape, operands: tuple[str, ...], attrs: tuple[Attribute, ...] = ()) -> str:
        inst = Instruction(edit.fresh_name(opcode), opcode, out, operands, (*attrs, *metadata))
        comp.add(inst, before=dot.name)
        return inst.name

    def as_type(name: str, element_type: str) -> str:
        array = _array(comp[name])
        assert array is not None
        if array.element_type == element_type:
            return name
        return add("convert", ArrayShape(element_type, array.dims), (name,))

    def normalized(operand: Instruction, batch: tuple[int, ...], contracting: tuple[int, ...]) -> str:
        array = _array(operand)
        assert array is not None
        perm = (*batch, *(i for i in range(array.rank) if i not in batch and i not in contracting), *contracting)
        name = operand.name
        if list(perm) != sorted(perm):
            out = ArrayShape(array.element_type, tuple(array.dims[i] for i in perm))
            name = add("transpose", out, (name,), (_int_list("dimensions", perm),))
        return as_type(name, shape.element_type)

    new_lhs, new_rhs = normalized(lhs, lb, lc), normalized(rhs, rb, rc)
    nb = len(lb)
    if multiply_only:
        if shape.rank != lhs_shape.rank:
            new_lhs = add("broadcast", shape, (new_lhs,), (_int_list("dimensions", tuple(range(lhs_shape.rank))),))
        if shape.rank != rhs_shape.rank:
            dims = (*range(nb), *range(lhs_shape.rank, shape.rank))
            new_rhs = add("broadcast", shape, (new_rhs,), (_int_list("dimensions", dims),))
        return add("multiply", shape, (new_lhs, new_rhs))
    lhs_outer = lhs_shape.rank - nb - len(lc)
    rhs_outer = rhs_shape.rank - nb - len(rc)
    if rhs_outer > 0:
        target = _array(comp[new_rhs])
        assert target is not None
        dims = (*range(nb), *range(nb + rhs_outer, nb + rhs_outer + lhs_shape.rank - nb))
        wide = ArrayShape(shape.element_type, target.dims)
        new_lhs = add("broadcast", wide, (new_lhs,), (_int_list("dimensions", dims),))
    elif lhs_outer > 0:
        target = _array(comp[new_lhs])
        assert target is not None
        dims = (*range(nb), *range(nb + lhs_outer, nb + lhs_outer + rhs_shape.rank - nb))
        wide = ArrayShape(shape.element_type, target.dims)
        new_rhs = add("broadcast", wide, (new_rhs,), (_int_list("dimensions", dims),))
    product_shape = _array(comp[new_lhs])
    assert product_shape is not None
    product = add("multiply", ArrayShape(shape.element_type, product_shape.dims), (new_lhs, new_rhs))
    floating = shape.element_type.startswith(("f", "bf"))
    dot_type = ("f64" if shape.element_type == "f64" else "f32") if floating else shape.element_type
    product = as_type(product, dot_type)
    outer = max(lhs_outer, rhs_outer)
    reduce_dims = tuple(range(outer + nb, outer + nb + len(lc)))
    zero = Instruction(edit.fresh_name("constant"), "constant", ArrayShape(dot_type, ()), (), literal="0")
    comp.add(zero, before=dot.name)
    reduced = ArrayShape(dot_type, tuple(d for k, d in enumerate(product_shape.dims) if k not in reduce_dims))
    adder = _scalar_add_computation(edit, dot_type, adders)
    to_apply = Attribute("to_apply", ComputationRefs((adder,)), "%" + adder)
    result = add("reduce", reduced, (product, zero.name), (_int_list("dimensions", reduce_dims), to_apply))
    return as_type(result, shape.element_type)


def _scalar_add_computation(edit: ModuleEdit, element_type: str, adders: dict[str, str]) -> str:
    """`GetOrCreateScalarAddComputation`: `scalar_add_computation`, appended to the computation list."""
    if element_type in adders:
        return adders[element_type]
    name = "scalar_add_computation"
    if name in edit.computations or name in edit.names:
        name = edit.fresh_name(name)
    else:
        edit.names.add(name)
    lhs, rhs, root = edit.fresh_name("scalar_lhs"), edit.fresh_name("scalar_rhs"), edit.fresh_name("add")
    scalar = ArrayShape(element_type, ())
    insts = (
        Instruction(lhs, "parameter", scalar, (), parameter_number=0),
        Instruction(rhs, "parameter", scalar, (), parameter_number=1),
        Instruction(root, "add", scalar, (lhs, rhs)),
    )
    edit.computations[name] = ComputationEdit(Computation(name, insts, root), edit)
    adders[element_type] = name
    return name


def _int_list(key: str, values: tuple[int, ...]) -> Attribute:
    return Attribute(key, values, "{" + ",".join(str(v) for v in values) + "}")


def _is_all(comp: ComputationEdit, inst: Instruction, value: float) -> bool:
    """XLA's `IsAll(op, value)`: a constant whose every element is `value`, or a broadcast of one."""
    while inst.opcode == "broadcast":
        inst = comp[inst.operands[0]]
    if inst.opcode != "constant" or inst.literal is None:
        return False
    words = re.findall(r"[^\s{},]+", inst.literal)
    if not words:
        return False
    for w in words:
        if w in ("true", "false"):
            number = 1.0 if w == "true" else 0.0
        else:
            try:
                number = float(w)
            except ValueError:
                return False
        if number != value:
            return False
    return True


def _passes_through(comp: ComputationEdit, inst: Instruction) -> str | None:
    """The operand a multiply by one returns unchanged, if it is one."""
    if inst.opcode == "multiply":
        lhs, rhs = (comp[o] for o in inst.operands)
        if _is_all(comp, rhs, 1):
            return lhs.name
        if _is_all(comp, lhs, 1):
            return rhs.name
    return None


def _slice_of_concat(comp: ComputationEdit, inst: Instruction) -> tuple[str, tuple[SliceDim, ...] | None] | None:
    """An unstrided slice inside one operand of a concatenate: (that operand, the slice of it to
    take, or None when the slice is all of it)."""
    concat = comp[inst.operands[0]]
    dims = inst.attr("slice")
    if concat.opcode != "concatenate" or not dims or any(d.stride != 1 for d in dims):
        return None
    axis = concat.attr("dimensions")[0]
    start, limit = dims[axis].start, dims[axis].limit
    piece_start = 0
    for name in concat.operands:
        size = comp[name].array_shape.dims[axis]
        if piece_start <= start and limit <= piece_start + size:
            operand = comp[name].array_shape
            shifted = tuple(
                SliceDim(d.start - piece_start, d.limit - piece_start) if k == axis else d for k, d in enumerate(dims)
            )
            whole = all(d.start == 0 and d.limit == n for d, n in zip(shifted, operand.dims))
            return name, (None if whole else shifted)
        if piece_start + size > start:
            return None  # the slice spans more than one operand
        piece_start += size
    return None


@dataclass(frozen=True)
class AlgebraicSimplifier:
    NAME: ClassVar[str] = "algsimp"
    MIRRORS: ClassVar[str] = "xla/service/algebraic_simplifier.cc (the rewrites that change propagation)"

    dot_to_multiply: bool = False

    def run(self, module: HloModule) -> Rewrite:
        edit = ModuleEdit(module)
        renamed: dict[str, str] = {}
        rewritten = 0
        negated = 0
        swapped = 0
        arithmetic: dict[str, str] = {}
        adders: dict[str, str] = {}
        for comp in list(edit.computations.values()):
            for inst in comp:
                if inst.sharding is not None or inst.name == comp.root_name:
                    continue  # an annotated value is the user's word; a root is what the caller reads
                if _identity(comp, inst):
                    comp.replace_uses(inst.name, inst.operands[0])
                    comp.remove(inst.name)
                    renamed[inst.name] = inst.operands[0]
                elif (through := _passes_through(comp, inst)) is not None and _same_shape(comp, inst, through):
                    comp.replace_uses(inst.name, through)
                    comp.remove(inst.name)
                    renamed[inst.name] = through
                elif inst.opcode == "slice" and (piece := _slice_of_concat(comp, inst)) is not None:
                    operand, dims = piece
                    if dims is None:
                        comp.replace_uses(inst.name, operand)
                        comp.remove(inst.name)
                        renamed[inst.name] = operand
                    else:
                        text = "{" + ", ".join(f"[{d.start}:{d.limit}]" for d in dims) + "}"
                        attrs = tuple(
                            Attribute("slice", dims, text) if a.key == "slice" else a for a in inst.attributes
                        )
                        comp.replace(dataclasses.replace(inst, operands=(operand,), attributes=attrs))
                        rewritten += 1
                elif inst.opcode == "broadcast" and _broadcast_is_reshape(comp, inst):
                    attrs = tuple(a for a in inst.attributes if a.key != "dimensions")
                    comp.replace(dataclasses.replace(inst, opcode="reshape", attributes=attrs))
                    rewritten += 1
                elif inst.opcode == "reshape" and _unannotated_reshape(comp[inst.operands[0]]):
                    inner = comp[inst.operands[0]]
                    comp.set_operands(inst.name, inner.operands)
                    rewritten += 1
                elif (
                    inst.opcode == "dot"
                    and (value := _dot_strength_reduction(edit, comp, inst, self.dot_to_multiply, adders)) is not None
                ):
                    comp.replace_uses(inst.name, value)
                    comp.remove(inst.name)
                    arithmetic[inst.name] = value
                elif inst.opcode == "transpose" and transpose_of_dot(comp, inst):
                    swapped += 1
                elif inst.opcode == "subtract" and (add := _subtract_of_constant(edit, comp, inst)) is not None:
                    comp.replace_uses(inst.name, add)
                    comp.remove(inst.name)
                    renamed[inst.name] = add
                    negated += 1
        if not (renamed or rewritten or arithmetic or swapped):
            return Rewrite(module)
        removed = len(renamed) - negated
        parts = [f"{removed} identity ops removed"] if removed else []
        parts += [f"{rewritten} broadcasts and reshapes rewritten as simpler reshapes"] if rewritten else []
        parts += [f"{negated} subtractions of a constant rewritten as additions"] if negated else []
        parts += [f"{len(arithmetic)} dots strength-reduced"] if arithmetic else []
        parts += [f"{swapped} transposes of a dot folded into it"] if swapped else []
        renamed.update(arithmetic)
        return Rewrite(edit.freeze(), renamed, "; ".join(parts))

"""Does an instruction's shape fit its operands and attributes? XLA's verifier asks; so do we.

The propagation rules and the memory model index dims by the attributes
(`broadcast dimensions={1}`, `dot lhs_contracting_dims={1}`, `slice={[0:4]}`),
so an attribute that does not fit the shapes must be refused where it is
written, with its line and column, not discovered later as an IndexError.
The checks follow XLA's shape inference for the ops the planner reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from planner.hlo.ir.module import Instruction
from planner.hlo.ir.opcodes import BINARY_ELEMENTWISE, UNARY_ELEMENTWISE
from planner.hlo.ir.shapes import ArrayShape, Shape

Check = Callable[[Instruction, list[ArrayShape], ArrayShape], "str | None"]
_ELEMENTWISE = UNARY_ELEMENTWISE | BINARY_ELEMENTWISE


def needs_shape_check(opcode: str) -> bool:
    return opcode in _CHECKS or (opcode in _ELEMENTWISE and opcode != "bitcast-convert")


def shapes_only_group(opcode: str) -> int:
    """For an opcode whose check looks at shapes alone (not at attributes), a number shared by
    the opcodes checked alike, given their operand count; else 0."""
    if not needs_shape_check(opcode):
        return 0
    # Elementwise ops take one or two operands, select and clamp three: the count tells them apart.
    groups: dict[Check, int] = {_elementwise: 1, _select_or_clamp: 1, _reshape: 2, _dynamic_update_slice: 3}
    return groups.get(_CHECKS.get(opcode, _elementwise), 0)


def shape_problem(inst: Instruction, operand_shapes: Sequence[Shape]) -> str | None:
    """Why `inst` cannot be what it says it is, or None."""
    check = _CHECKS.get(inst.opcode)
    if check is None and (inst.opcode in UNARY_ELEMENTWISE or inst.opcode in BINARY_ELEMENTWISE):
        check = _elementwise if inst.opcode != "bitcast-convert" else None  # may add or drop a dim
    if check is None or inst.shape.__class__ is not ArrayShape or (inst.shape.dynamic and any(inst.shape.dynamic)):
        return None
    for s in operand_shapes:
        if s.__class__ is not ArrayShape or (s.dynamic and any(s.dynamic)):  # type: ignore[union-attr]
            return None
    return check(inst, list(operand_shapes), inst.shape)  # type: ignore[arg-type]


def _dims_in(dims: Sequence[int], rank: int, what: str) -> str | None:
    bad = [d for d in dims if not 0 <= d < rank]
    if bad:
        return f"{what} {list(dims)} name dims {bad} outside rank {rank}"
    if len(set(dims)) != len(dims):
        return f"{what} {list(dims)} repeat a dim"
    return None


def _elementwise(inst: Instruction, operands: list[ArrayShape], out: ArrayShape) -> str | None:
    for i, operand in enumerate(operands):
        if operand.dims != out.dims:
            return f"operand {i} is {operand.to_text(False)} but the result is {out.to_text(False)}"
    return None


def _select_or_clamp(inst: Instruction, operands: list[ArrayShape], out: ArrayShape) -> str | None:
    # select's predicate and clamp's bounds may be scalars.
    for i, operand in enumerate(operands):
        if operand.dims != out.dims and operand.rank != 0:
            return f"operand {i} is {operand.to_text(False)} but the result is {out.to_text(False)}"
    return None


def _broadcast(inst: Instruction, operands: list[ArrayShape], out: ArrayShape) -> str | None:
    dims = tuple(inst.attr("dimensions", ()))
    operand = operands[0]
    if len(dims) != operand.rank:
        return f"broadcast dimensions={{{','.join(map(str, dims))}}} must list one dim per operand dim ({operand.rank})"
    problem = _dims_in(dims, out.rank, "broadcast dimensions")
    if problem:
        return problem
    for i, d in enumerate(dims):
        if operand.dims[i] not in (out.dims[d], 1) or (operand.dims[i] == 1 and out.dims[d] == 0):
            return f"operand dim {i} ({operand.dims[i]}) does not broadcast to result dim {d} ({out.dims[d]})"
    return None


def _transpose(inst: Instruction, operands: list[ArrayShape], out: ArrayShape) -> str | None:
    perm = tuple(inst.attr("dimensions", ()))
    operand = operands[0]
    if sorted(perm) != list(range(operand.rank)) or out.rank != operand.rank:
        return f"transpose dimensions={{{','.join(map(str, perm))}}} is not a permutation of {operand.rank} dims"
    if tuple(operand.dims[p] for p in perm) != out.dims:
        return f"transposing {operand.to_text(False)} by {list(perm)} does not give {out.to_text(False)}"
    return None


def _reshape(inst: Instruction, operands: list[ArrayShape], out: ArrayShape) -> str | None:
    operand = operands[0]
    if any(operand.dynamic) or any(out.dynamic):
        return None
    if math.prod(operand.dims) != math.prod(out.dims):
        return f"reshape of {operand.to_text(False)} to {out.to_text(False)} changes the element count"
    return None


def _dot(inst: Instruction, operands: list[ArrayShape], out: ArrayShape) -> str | None:
    lhs, rhs = operands[0], operands[1]
    lc, rc = tuple(inst.attr("lhs_contracting_dims", ())), tuple(inst.attr("rhs_contracting_dims", ()))
    lb, rb = tuple(inst.attr("lhs_batch_dims", ())), tuple(inst.attr("rhs_batch_dims", ()))
    for dims, shape, what in ((lc + lb, lhs, "lhs dims"), (rc + rb, rhs, "rhs dims")):
        problem = _dims_in(dims, shape.rank, what)
        if problem:
            return problem
    if len(lc) != len(rc) or len(lb) != len(rb):
        return "dot needs as many lhs as rhs contracting (and batch) dims"
    for a, b in (*zip(lc, rc), *zip(lb, rb)):
        if lhs.dims[a] != rhs.dims[b]:
            return f"dot pairs lhs dim {a} ({lhs.dims[a]}) with rhs dim {b} ({rhs.dims[b]})"
    expected = len(lb) + (lhs.rank - len(lc) - len(lb)) + (rhs.rank - len(rc) - len(rb))
    if out.rank != expected:
        return f"dot of {lhs.to_text(False)} and {rhs.to_text(False)} has rank {expected}, not {out.rank}"
    return None


def _concatenate(inst: Instruction, operands: list[ArrayShape], out: ArrayShape) -> str | None:
    dims = tuple(inst.attr("dimensions", ()))
    if len(dims) != 1 or not 0 <= dims[0] < out.rank:
        return f"concatenate needs one dimension within rank {out.rank}"
    d = dims[0]
    for i, operand in enumerate(operands):
        if operand.rank != out.rank or any(a != b for k, (a, b) in enumerate(zip(operand.dims, out.dims)) if k != d):
            return f"operand {i} {operand.to_text(False)} does not fit {out.to_text(False)} along dims other than {d}"
    if not any(out.dynamic) and sum(o.dims[d] for o in operands) != out.dims[d]:
        return f"operands add up to {sum(o.dims[d] for o in operands)} along dim {d}, the result has {out.dims[d]}"
    return None


def _slice(inst: Instruction, operands: list[ArrayShape], out: ArrayShape) -> str | None:
    ranges = inst.attr("slice", ())
    operand = operands[0]
    if len(ranges) != operand.rank or out.rank != operand.rank:
        return f"slice has {len(ranges)} ranges for an operand of rank {operand.rank}"
    for k, (r, n) in enumerate(zip(ranges, operand.dims)):
        if not 0 <= r.start <= r.limit <= n or r.stride < 1:
            return f"slice range [{r.start}:{r.limit}:{r.stride}] does not fit dim {k} of size {n}"
    return None


def _dynamic_slice(inst: Instruction, operands: list[ArrayShape], out: ArrayShape) -> str | None:
    operand = operands[0]
    sizes = tuple(inst.attr("dynamic_slice_sizes", ()))
    if len(operands) - 1 != operand.rank:
        return f"dynamic-slice of rank {operand.rank} needs {operand.rank} start indices, has {len(operands) - 1}"
    if len(sizes) != operand.rank or out.dims != sizes or any(s > n for s, n in zip(sizes, operand.dims)):
        return f"dynamic_slice_sizes={{{','.join(map(str, sizes))}}} do not fit {operand.to_text(False)}"
    return None


def _dynamic_update_slice(inst: Instruction, operands: list[ArrayShape], out: ArrayShape) -> str | None:
    operand, update = operands[0], operands[1]
    if len(operands) - 2 != operand.rank:
        return (
            f"dynamic-update-slice of rank {operand.rank} needs {operand.rank} start indices, has {len(operands) - 2}"
        )
    if update.rank != operand.rank or any(u > n for u, n in zip(update.dims, operand.dims)):
        return f"update {update.to_text(False)} does not fit in {operand.to_text(False)}"
    if out.dims != operand.dims:
        return f"the result {out.to_text(False)} is not the operand's shape {operand.to_text(False)}"
    return None


def _reduce(inst: Instruction, operands: list[ArrayShape], out: ArrayShape) -> str | None:
    dims = tuple(inst.attr("dimensions", ()))
    operand = operands[0]
    problem = _dims_in(dims, operand.rank, "reduce dimensions")
    if problem:
        return problem
    kept = tuple(n for k, n in enumerate(operand.dims) if k not in dims)
    if kept != out.dims:
        return f"reducing {operand.to_text(False)} over {list(dims)} gives {list(kept)}, not {out.to_text(False)}"
    return None


def _index_dims_problem(inst: Instruction, limits: Sequence[tuple[str, int]], indices: ArrayShape) -> str | None:
    """Gather and scatter name dims in several attributes, each within the rank of one operand."""
    for key, rank in limits:
        problem = _dims_in(tuple(inst.attr(key, ())), rank, key)
        if problem:
            return problem
    if not 0 <= inst.attr("index_vector_dim", indices.rank) <= indices.rank:
        return f"index_vector_dim is outside the indices' rank {indices.rank}"
    return None


def _gather(inst: Instruction, operands: list[ArrayShape], out: ArrayShape) -> str | None:
    operand, indices = operands[0], operands[1]
    limits = [("collapsed_slice_dims", operand.rank), ("start_index_map", operand.rank),
              ("operand_batching_dims", operand.rank), ("offset_dims", out.rank),
              ("start_indices_batching_dims", indices.rank)]  # fmt: skip
    problem = _index_dims_problem(inst, limits, indices)
    if problem:
        return problem
    sizes = tuple(inst.attr("slice_sizes", ()))
    if len(sizes) != operand.rank or any(not 0 <= n <= d for n, d in zip(sizes, operand.dims)):
        return f"slice_sizes={{{','.join(map(str, sizes))}}} do not fit the operand {operand.to_text(False)}"
    return None


def _scatter(inst: Instruction, operands: list[ArrayShape], out: ArrayShape) -> str | None:
    count = len(operands) // 2  # operands..., indices, updates...
    operand, indices, update = operands[0], operands[count], operands[-1]
    limits = [("inserted_window_dims", operand.rank), ("scatter_dims_to_operand_dims", operand.rank),
              ("input_batching_dims", operand.rank), ("update_window_dims", update.rank),
              ("scatter_indices_batching_dims", indices.rank)]  # fmt: skip
    return _index_dims_problem(inst, limits, indices)


_CHECKS: dict[str, Check] = {
    "gather": _gather,
    "scatter": _scatter,
    "broadcast": _broadcast,
    "transpose": _transpose,
    "reshape": _reshape,
    "dot": _dot,
    "concatenate": _concatenate,
    "slice": _slice,
    "dynamic-slice": _dynamic_slice,
    "dynamic-update-slice": _dynamic_update_slice,
    "reduce": _reduce,
    "select": _select_or_clamp,
    "clamp": _select_or_clamp,
    "compare": _elementwise,
}

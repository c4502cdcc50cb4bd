"""Inferred shapes of data movement: broadcast, concatenate, transpose, pad, gather, scatter, ...

Part of `shape_inference`, which dispatches here; each rule follows the
ShapeInference function XLA's parser calls for its opcode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from planner.hlo.inference.algebra import (
    Op,
    Rule,
    ShapeInferenceError,
    check_size,
    compatible,
    compatible_size,
    default_layout,
    dynamic_dim,
    expect_array,
    higher_precision,
    is_array,
    is_integral,
    is_scalar,
    make_shape,
    same_type_ignoring_fp,
    unbounded,
    verify_reducer,
)
from planner.hlo.ir.shapes import ArrayShape, Shape, TupleShape


def _broadcast(op: Op) -> Shape:
    """Written without a shape, `dimensions=` gives the sizes of new major dims (InferBroadcastShape)."""
    operand = op.array(0, "operand of broadcast")
    sizes = op.ints("dimensions") if op.attr("dimensions") is not None or operand.rank else ()
    if any(map(unbounded, operand.dims)):
        raise ShapeInferenceError("cannot broadcast an operand with unbounded dims")
    if any(size < 0 for size in sizes):
        raise ShapeInferenceError(f"broadcast with negative dimension size in {list(sizes)}")
    dims = (*sizes, *operand.dims)
    check_size(operand.element_type, dims)
    return make_shape(
        operand.element_type, dims, [False] * len(sizes) + [dynamic_dim(operand, i) for i in range(operand.rank)]
    )


def _concatenate(op: Op) -> Shape:
    dims = op.ints("dimensions")
    first = op.array(0, "operand of concatenation")
    if len(dims) != 1 or not 0 <= dims[0] < first.rank:
        raise ShapeInferenceError(f"concatenate dimension {list(dims)} is out of bounds for rank {first.rank}")
    axis, element_type = dims[0], first.element_type
    shapes = [op.array(i, "operand of concatenation") for i in range(len(op.operands))]
    for s in shapes[1:]:
        if s.rank != first.rank or not same_type_ignoring_fp(first, s):
            raise ShapeInferenceError(f"cannot concatenate {first.to_text(False)} and {s.to_text(False)}")
        if any(
            k != axis and not (a == b or unbounded(a) or unbounded(b))
            for k, (a, b) in enumerate(zip(first.dims, s.dims))
        ):
            raise ShapeInferenceError(f"cannot concatenate {first.to_text(False)} and {s.to_text(False)}: they differ "
                                      f"in dims other than {axis}")  # fmt: skip
        element_type = higher_precision(s.element_type, element_type)
    sizes, bounds = [-1] * first.rank, [-1] * first.rank
    sizes[axis] = 0
    for s in shapes:
        for k in range(first.rank):
            size, bound = s.dims[k], s.dims[k] if dynamic_dim(s, k) else -1
            if k == axis:
                sizes[k], bounds[k] = _concatenated(sizes[k], size, bounds[k], bound)
            else:
                sizes[k], bounds[k] = _most_specific(k, sizes[k], size, bounds[k], bound)
    dynamic = [bounds[k] >= 0 or unbounded(sizes[k]) for k in range(first.rank)]
    return make_shape(element_type, sizes, dynamic)


def _concatenated(size_a: int, size_b: int, bound_a: int, bound_b: int) -> tuple[int, int]:
    size = size_a + size_b if size_a >= 0 and size_b >= 0 else -1
    bound = -1
    if bound_a >= 0 or bound_b >= 0:
        a, b = (bound_a if bound_a >= 0 else size_a), (bound_b if bound_b >= 0 else size_b)
        bound = a + b if a >= 0 and b >= 0 else -1
    return size, bound


def _most_specific(k: int, size_a: int, size_b: int, bound_a: int, bound_b: int) -> tuple[int, int]:
    bound = -1
    if bound_a >= 0 or bound_b >= 0:
        if bound_a >= 0 and bound_b >= 0 and bound_a != bound_b:
            raise ShapeInferenceError(f"mismatched bounds {bound_a} and {bound_b} in dim {k}")
        bound = bound_a if bound_a >= 0 else bound_b
    size = -1
    if size_a >= 0 or size_b >= 0:
        if size_a >= 0 and size_b >= 0 and size_a != size_b:
            raise ShapeInferenceError(f"mismatched sizes {size_a} and {size_b} in dim {k}")
        size = size_a if size_a >= 0 else size_b
        if bound >= 0 and size != bound:
            raise ShapeInferenceError(f"mismatched size {size} and bound {bound} in dim {k}")
    return size, bound


def _transpose(op: Op) -> Shape:
    operand, perm = op.array(0, "transpose"), op.ints("dimensions")
    if sorted(perm) != list(range(operand.rank)):
        raise ShapeInferenceError(f"transpose dimensions {list(perm)} are not a permutation of the dims of "
                                  f"{operand.to_text(False)}")  # fmt: skip
    dims = tuple(operand.dims[p] for p in perm)
    dynamic = tuple(dynamic_dim(operand, p) for p in perm) if operand.dynamic else ()
    return ArrayShape(operand.element_type, dims, dynamic, _permuted_layout(operand, perm))


def _permuted_layout(operand: ArrayShape, perm: Sequence[int]) -> str | None:
    """ShapeUtil::PermuteDimensions carries the layout along: result dim i is operand dim perm[i]."""
    layout = operand.layout or default_layout(operand.rank)
    if layout is None:
        return None
    order, colon, rest = layout[1:-1].partition(":")
    try:
        minor_to_major = [int(d) for d in order.split(",")] if order.strip() else []
    except ValueError:
        return default_layout(operand.rank)
    inverse = {p: i for i, p in enumerate(perm)}
    if any(d not in inverse for d in minor_to_major):
        return layout
    return "{" + ",".join(str(inverse[d]) for d in minor_to_major) + colon + rest + "}"


def _reverse(op: Op) -> Shape:
    operand, dims = op.array(0, "operand of reverse"), op.ints("dimensions")
    if len(set(dims)) != len(dims) or any(not 0 <= d < operand.rank for d in dims):
        raise ShapeInferenceError(f"reverse dimensions {list(dims)} do not fit {operand.to_text(False)}")
    return operand


def _pad(op: Op) -> Shape:
    operand, padding = op.array(0, "operand of pad"), op.attr("padding", ())
    if not is_scalar(op.operands[1]):
        raise ShapeInferenceError(f"the padding value must be a scalar, not {op.operands[1].to_text(False)}")
    value = op.array(1)
    if len(padding) != operand.rank:
        raise ShapeInferenceError(f"padding has {len(padding)} dims for an operand of rank {operand.rank}")
    if not same_type_ignoring_fp(operand, value):
        raise ShapeInferenceError("the element types of the operands to pad do not match")
    if any(p.interior < 0 for p in padding):
        raise ShapeInferenceError("interior padding cannot be negative")
    dims = []
    for k, (size, p) in enumerate(zip(operand.dims, padding)):
        dims.append(size if unbounded(size) else size + p.low + p.high + max(size - 1, 0) * p.interior)
        if dims[-1] < 0 and not unbounded(size):
            raise ShapeInferenceError(f"padding gives dim {k} a negative size")
    element_type = higher_precision(operand.element_type, value.element_type)
    return make_shape(element_type, dims, [dynamic_dim(operand, i) for i in range(operand.rank)])


def _get_dimension_size(op: Op) -> Shape:
    operand, dims = op.operands[0], op.ints("dimensions")
    rank = operand.rank if isinstance(operand, ArrayShape) else 0
    if not dims or not 0 <= dims[0] < rank:
        raise ShapeInferenceError(f"dimension {list(dims)} is out of bounds for {operand.to_text(False)}")
    if operand.dims[dims[0]] > 2**31 - 1:  # type: ignore[union-attr]
        raise ShapeInferenceError("the dim exceeds INT_MAX")
    if op.opcode == "get-dimension-size":
        return ArrayShape("s32", ())
    value = op.operands[1]
    if not compatible(value, ArrayShape("s32", ())) or not is_array(value):
        raise ShapeInferenceError(f"set-dimension-size's value has to be s32[], got {value.to_text(False)}")
    s: ArrayShape = operand  # type: ignore[assignment]
    dynamic = [dynamic_dim(s, i) or i == dims[0] for i in range(s.rank)]
    return dataclasses.replace(s, dynamic=tuple(dynamic))


def _sorted_unique(values: Sequence[int], limit: int, what: str) -> None:
    if list(values) != sorted(set(values)) or any(not 0 <= v < limit for v in values):
        raise ShapeInferenceError(f"{what} {list(values)} must be sorted, unique and within [0, {limit})")


def _unique_within(values: Sequence[int], limit: int, what: str) -> None:
    if len(set(values)) != len(values) or any(not 0 <= v < limit for v in values):
        raise ShapeInferenceError(f"{what} {list(values)} must be unique and within [0, {limit})")


def _expanded_indices(op: Op, indices: ArrayShape) -> tuple[list[int], list[bool], int]:
    """Indices of shape [A,B] with index_vector_dim=2 read as [A,B,1]."""
    if not is_integral(indices.element_type):
        raise ShapeInferenceError(f"{op.opcode} indices must be integral, not {indices.to_text(False)}")
    vector_dim = op.int("index_vector_dim")
    if not 0 <= vector_dim <= indices.rank:
        raise ShapeInferenceError(f"index_vector_dim {vector_dim} is outside [0, {indices.rank}]")
    dims, dynamic = list(indices.dims), [dynamic_dim(indices, i) for i in range(indices.rank)]
    if vector_dim == indices.rank:
        dims.append(1)
        dynamic.append(False)
    return dims, dynamic, vector_dim


def _gather(op: Op) -> Shape:
    operand, indices = op.array(0, "gather operand"), op.array(1, "gather indices")
    index_dims, index_dynamic, vector_dim = _expanded_indices(op, indices)
    offset, collapsed, start_map = op.ints("offset_dims"), op.ints("collapsed_slice_dims"), op.ints("start_index_map")
    batching = op.ints("operand_batching_dims") if op.attr("operand_batching_dims") is not None else ()
    index_batching = (op.ints("start_indices_batching_dims")
                      if op.attr("start_indices_batching_dims") is not None else ())  # fmt: skip
    sizes = op.ints("slice_sizes")
    _sorted_unique(offset, len(offset) + len(index_dims) - 1, "offset_dims")
    if not unbounded(index_dims[vector_dim]) and len(start_map) != index_dims[vector_dim]:
        raise ShapeInferenceError(f"start_index_map has {len(start_map)} entries, the index vector "
                                  f"{index_dims[vector_dim]}")  # fmt: skip
    _unique_within(start_map, operand.rank, "start_index_map")
    _sorted_unique(collapsed, operand.rank, "collapsed_slice_dims")
    if len(batching) != len(index_batching):
        raise ShapeInferenceError("operand_batching_dims and start_indices_batching_dims differ in length")
    _sorted_unique(batching, operand.rank, "operand_batching_dims")
    _unique_within(index_batching, len(index_dims), "start_indices_batching_dims")
    if len(sizes) != operand.rank or len(sizes) != len(offset) + len(collapsed) + len(batching):
        raise ShapeInferenceError(f"slice_sizes {list(sizes)} do not fit {operand.to_text(False)} and the dims "
                                  "that are offset, collapsed or batched")  # fmt: skip
    for size, bound in zip(sizes, operand.dims):
        if not unbounded(bound) and not 0 <= size <= bound:
            raise ShapeInferenceError(f"slice_sizes {list(sizes)} do not fit {operand.to_text(False)}")
    if any(sizes[d] > 1 for d in (*collapsed, *batching)):
        raise ShapeInferenceError("collapsed and batching dims must have slice size 0 or 1")
    window = iter(d for d in range(operand.rank) if d not in collapsed and d not in batching)
    batch = iter(d for d in range(len(index_dims)) if d != vector_dim)
    dims, dynamic = [], []
    for i in range(len(offset) + len(index_dims) - 1):
        if i in offset:
            d = next(window)
            dims.append(sizes[d])
            dynamic.append(sizes[d] == operand.dims[d] and dynamic_dim(operand, d))
        else:
            d = next(batch)
            dims.append(index_dims[d])
            dynamic.append(index_dynamic[d])
    return make_shape(operand.element_type, dims, dynamic)


def _scatter(op: Op) -> Shape:
    count = len(op.operands) // 2
    indices = expect_array(op.operands[count], "scatter indices")
    index_dims, _, vector_dim = _expanded_indices(op, indices)
    window, inserted = op.ints("update_window_dims"), op.ints("inserted_window_dims")
    to_operand = op.ints("scatter_dims_to_operand_dims")
    batching = op.ints("input_batching_dims") if op.attr("input_batching_dims") is not None else ()
    index_batching = (op.ints("scatter_indices_batching_dims")
                      if op.attr("scatter_indices_batching_dims") is not None else ())  # fmt: skip
    operands = [op.array(i) for i in range(count)]
    for operand, update in zip(operands, [op.array(count + 1 + i) for i in range(count)]):
        max_sizes = [n for d, n in enumerate(operand.dims) if d not in inserted and d not in batching]
        if update.rank != len(index_dims) - 1 + len(window):
            raise ShapeInferenceError(f"updates must have rank {len(index_dims) - 1 + len(window)}, "
                                      f"not {update.to_text(False)}")  # fmt: skip
        _sorted_unique(window, update.rank, "update_window_dims")
        _sorted_unique(inserted, operand.rank, "inserted_window_dims")
        if len(window) + len(inserted) + len(batching) != operand.rank:
            raise ShapeInferenceError(f"the scatter window does not match the rank of {operand.to_text(False)}")
        if not compatible_size(len(to_operand), index_dims[vector_dim]):
            raise ShapeInferenceError("scatter_dims_to_operand_dims does not match the index vector")
        _unique_within(to_operand, operand.rank, "scatter_dims_to_operand_dims")
        if len(batching) != len(index_batching):
            raise ShapeInferenceError("input_batching_dims and scatter_indices_batching_dims differ in length")
        _sorted_unique(batching, operand.rank, "input_batching_dims")
        _unique_within(index_batching, len(index_dims), "scatter_indices_batching_dims")
        if any(update.dims[d] > max_sizes[i] for i, d in enumerate(window)):
            raise ShapeInferenceError(f"update window {update.to_text(False)} exceeds {operand.to_text(False)}")
        scatter = iter(d for d in range(len(index_dims)) if d != vector_dim)
        for i in (d for d in range(update.rank) if d not in window):
            if not compatible_size(update.dims[i], index_dims[next(scatter)]):
                raise ShapeInferenceError(f"update dim {i} of {update.to_text(False)} does not match the indices")
    updates = [op.operands[count + 1 + i] for i in range(count)]
    inits = [ArrayShape(s.element_type, ()) for s in operands]
    verify_reducer(op.callee("to_apply"), inits, [u.element_type for u in updates])  # type: ignore[union-attr]
    return operands[0] if count == 1 else TupleShape(tuple(operands))


RULES: dict[str, Rule] = {
    "broadcast": _broadcast,
    "concatenate": _concatenate,
    "transpose": _transpose,
    "reverse": _reverse,
    "pad": _pad,
    "get-dimension-size": _get_dimension_size,
    "set-dimension-size": _get_dimension_size,
    "gather": _gather,
    "scatter": _scatter,
}

"""Inferred shapes of contractions and linear algebra: dot, convolution, fft, solvers, batch norm.

Part of `shape_inference`, which dispatches here; each rule follows the
ShapeInference function XLA's parser calls for its opcode.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.hlo.inference.algebra import (
    COMPLEX_PART,
    Op,
    Rule,
    ShapeInferenceError,
    compatible,
    compatible_size,
    dynamic_dim,
    higher_precision,
    is_floating,
    make_shape,
    same_type_ignoring_fp,
    unbounded,
    window_output,
)
from planner.hlo.ir.shapes import ArrayShape, Shape, TupleShape


def dot_shape(lhs: ArrayShape, rhs: ArrayShape, lc: Sequence[int], rc: Sequence[int], lb: Sequence[int],
              rb: Sequence[int]) -> ArrayShape:  # fmt: skip
    """InferDotOpShape: batch dims, then lhs's free dims, then rhs's."""
    where = f"{lhs.to_text(False)} <dot> {rhs.to_text(False)}"
    if any(not 0 <= d < lhs.rank for d in (*lc, *lb)) or any(not 0 <= d < rhs.rank for d in (*rc, *rb)):
        raise ShapeInferenceError(f"a dimension number is out of range in dot: {where}")
    if len(set(lc) | set(lb)) != len(lc) + len(lb) or len(set(rc) | set(rb)) != len(rc) + len(rb):
        raise ShapeInferenceError(f"a dimension number is not unique in dot: {where}")
    if len(lc) != len(rc):
        raise ShapeInferenceError(f"{where}: lhs and rhs need as many contracting dims")
    if any(not compatible_size(lhs.dims[a], rhs.dims[b]) for a, b in zip(lc, rc)):
        raise ShapeInferenceError(f"{where}: contracting dimension sizes are not compatible")
    if len(lb) != len(rb):
        raise ShapeInferenceError(f"{where}: lhs and rhs need as many batch dims")
    if any(not compatible_size(lhs.dims[a], rhs.dims[b]) for a, b in zip(lb, rb)):
        raise ShapeInferenceError(f"{where}: batch dimension sizes are not compatible")
    lhs_free = [i for i in range(lhs.rank) if i not in lc and i not in lb]
    rhs_free = [i for i in range(rhs.rank) if i not in rc and i not in rb]
    dims = [lhs.dims[i] for i in (*lb, *lhs_free)] + [rhs.dims[i] for i in rhs_free]
    dynamic = [dynamic_dim(lhs, i) for i in (*lb, *lhs_free)] + [dynamic_dim(rhs, i) for i in rhs_free]
    return make_shape(higher_precision(lhs.element_type, rhs.element_type), dims, dynamic)


def _dot_dims(op: Op) -> tuple[tuple[int, ...], ...]:
    keys = ("lhs_contracting_dims", "rhs_contracting_dims", "lhs_batch_dims", "rhs_batch_dims")
    return tuple(op.ints(k) if op.attr(k) is not None else () for k in keys)


def _dot(op: Op) -> Shape:
    # jaxlib 0.7.1 infers scaled-dot(lhs, rhs, lhs_scale, rhs_scale) from its first and third operands.
    rhs = 2 if op.opcode == "scaled-dot" else 1
    return dot_shape(op.array(0, "lhs of dot"), op.array(rhs, "rhs of dot"), *_dot_dims(op))


def _ragged_dot(op: Op) -> Shape:
    """The dot of lhs and one group of rhs: rhs's group dims drop out."""
    lhs, rhs = op.array(0, "lhs of ragged dot"), op.array(1, "rhs of ragged dot")
    lc, rc, lb, rb = _dot_dims(op)
    group = op.ints("rhs_group_dims") if op.attr("rhs_group_dims") is not None else ()
    if any(not 0 <= d < rhs.rank for d in group):
        raise ShapeInferenceError(f"rhs_group_dims {list(group)} are out of range for {rhs.to_text(False)}")
    kept = [i for i in range(rhs.rank) if i not in group]
    inner = ArrayShape(rhs.element_type, tuple(rhs.dims[i] for i in kept))
    renumber = {old: new for new, old in enumerate(kept)}
    return dot_shape(lhs, inner, lc, [renumber.get(d, -1) for d in rc], lb, [renumber.get(d, -1) for d in rb])


def _convolution(op: Op) -> Shape:
    lhs, rhs = op.array(0, "lhs of convolution"), op.array(1, "rhs of convolution")
    features, batches = op.int("feature_group_count", 1), op.int("batch_group_count", 1)
    labels, window = op.attr("dim_labels"), op.attr("window", ())
    if features <= 0 or batches <= 0 or (features > 1 and batches > 1):
        raise ShapeInferenceError("feature_group_count and batch_group_count must be positive, and not both > 1")
    if labels is None:
        raise ShapeInferenceError("convolution needs dim_labels=...")
    num_dims = len(labels.lhs)
    if not (len(labels.rhs) == len(labels.out) == num_dims == lhs.rank == rhs.rank) or len(window) != num_dims - 2:
        raise ShapeInferenceError(f"dim_labels {labels.lhs}_{labels.rhs}->{labels.out} and the window do not fit "
                                  f"{lhs.to_text(False)} and {rhs.to_text(False)}")  # fmt: skip
    try:
        in_batch, in_feature = labels.lhs.index("b"), labels.lhs.index("f")
        k_in, k_out = labels.rhs.index("i"), labels.rhs.index("o")
        out_batch, out_feature = labels.out.index("b"), labels.out.index("f")
    except ValueError:
        raise ShapeInferenceError(f"dim_labels {labels.lhs}_{labels.rhs}->{labels.out} lack a batch or feature "
                                  "dim") from None  # fmt: skip
    in_spatial, k_spatial, out_spatial = (labels.spatial_dims(x) for x in (labels.lhs, labels.rhs, labels.out))
    input_features, kernel_out = lhs.dims[in_feature], rhs.dims[k_out]
    if kernel_out % batches or input_features % features or input_features // features != rhs.dims[k_in]:
        raise ShapeInferenceError(f"feature dims of {lhs.to_text(False)} and {rhs.to_text(False)} do not fit "
                                  f"feature_group_count={features}, batch_group_count={batches}")  # fmt: skip
    if kernel_out % features or lhs.dims[in_batch] % batches:
        raise ShapeInferenceError("output features or batch are not divisible by the group count")
    if [rhs.dims[d] for d in k_spatial] != [w.size for w in window]:
        raise ShapeInferenceError(
            f"the window sizes {[w.size for w in window]} do not match the kernel {rhs.to_text(False)}"
        )
    spatial = [lhs.dims[d] for d in in_spatial]
    base = make_shape(lhs.element_type, spatial, [unbounded(d) for d in spatial])
    windowed = window_output(base, window, lhs.element_type)
    dims = [0] * num_dims
    dims[out_batch], dims[out_feature] = lhs.dims[in_batch] // batches, kernel_out
    for d, size in zip(out_spatial, windowed.dims):
        dims[d] = size
    dynamic = [False] * num_dims
    dynamic[out_batch] = dynamic_dim(lhs, in_batch)
    for i, o in zip(in_spatial, out_spatial):
        dynamic[o] = dynamic[o] or dynamic_dim(lhs, i)
    for k, o in zip(k_spatial, out_spatial):
        dynamic[o] = dynamic[o] or dynamic_dim(rhs, k)
    if dynamic_dim(rhs, k_out):
        raise ShapeInferenceError("a dynamic output feature dim on the kernel is not supported")
    return make_shape(higher_precision(lhs.element_type, rhs.element_type), dims, dynamic)


def _fft(op: Op) -> Shape:
    operand, kind, length = op.array(0, "operand of fft"), op.attr("fft_type"), op.ints("fft_length")
    t, n = operand.element_type, len(length)
    if not 1 <= n <= 3 or operand.rank < n:
        raise ShapeInferenceError(f"fft of rank {n} does not fit {operand.to_text(False)}")
    if kind in ("FFT", "IFFT"):
        if t not in COMPLEX_PART:
            raise ShapeInferenceError(f"{kind} needs a complex operand, not {t}")
        return operand
    dims, dynamic = list(operand.dims), [dynamic_dim(operand, i) for i in range(operand.rank)]
    if kind == "RFFT":
        if t not in ("f32", "f64") or any(not compatible_size(d, m) for d, m in zip(dims[-n:], length)):
            raise ShapeInferenceError(f"RFFT of {operand.to_text(False)} with fft_length={list(length)}")
        if length[-1]:
            dims[-1], dynamic[-1] = length[-1] // 2 + 1, dynamic[-1] and not unbounded(dims[-1])
        return make_shape("c64" if t == "f32" else "c128", dims, dynamic)
    if kind == "IRFFT":
        last, want = dims[-1], length[-1] // 2 + 1
        if (
            t not in COMPLEX_PART
            or dims[-n:-1] != list(length[:-1])
            or ((last or length[-1]) and not unbounded(last) and last != want)
        ):
            raise ShapeInferenceError(f"IRFFT of {operand.to_text(False)} with fft_length={list(length)}")
        dims[-1], dynamic[-1] = length[-1], dynamic[-1] and not unbounded(last)
        return make_shape(COMPLEX_PART[t], dims, dynamic)
    raise ShapeInferenceError(f"unknown fft_type {kind}")


def _triangular_solve(op: Op) -> Shape:
    a, b = op.array(0, "a of triangular solve"), op.array(1, "b of triangular solve")
    left = getattr(op.attr("left_side"), "text", "false") == "true"
    if not (is_floating(a.element_type) or a.element_type in COMPLEX_PART) or a.element_type != b.element_type:
        raise ShapeInferenceError(f"triangular-solve needs identical floating or complex types, got "
                                  f"{a.element_type} and {b.element_type}")  # fmt: skip
    if a.rank < 2 or b.rank != a.rank:
        raise ShapeInferenceError(f"triangular-solve of {a.to_text(False)} and {b.to_text(False)}: ranks do not fit")
    if not compatible_size(a.dims[-2], a.dims[-1]) or not compatible_size(a.dims[-1], b.dims[-2 if left else -1]):
        raise ShapeInferenceError(f"triangular-solve of {a.to_text(False)} and {b.to_text(False)}: dims do not fit")
    if a.dims[:-2] != b.dims[:-2]:
        raise ShapeInferenceError("the batch dims of triangular-solve's operands differ")
    return b


def _cholesky(op: Op) -> Shape:
    a = op.array(0, "operand of cholesky")
    if not (is_floating(a.element_type) or a.element_type in COMPLEX_PART) or a.rank < 2:
        raise ShapeInferenceError(f"cholesky needs a floating or complex operand of rank >= 2, not {a.to_text(False)}")
    if not compatible_size(a.dims[-2], a.dims[-1]):
        raise ShapeInferenceError(f"the two minor dims of {a.to_text(False)} differ")
    return a


def _batch_norm(op: Op) -> Shape:
    shapes = [op.array(i, f"operand {i} of {op.opcode}") for i in range(len(op.operands))]
    operand, feature_index = shapes[0], op.int("feature_index")
    if not 0 <= feature_index < operand.rank:
        raise ShapeInferenceError(f"feature_index {feature_index} is outside the rank of {operand.to_text(False)}")
    if not is_floating(operand.element_type):
        raise ShapeInferenceError(f"{op.opcode} needs a floating operand, not {operand.element_type}")
    features = operand.dims[feature_index]
    for s in shapes[1:]:
        is_grad_output = op.opcode == "batch-norm-grad" and s is shapes[4]
        if is_grad_output:
            if not compatible(s, operand, ignore_fp=True):
                raise ShapeInferenceError(f"grad_output {s.to_text(False)} does not match {operand.to_text(False)}")
        elif s.rank != 1 or not same_type_ignoring_fp(s, operand) or not compatible_size(s.dims[0], features):
            raise ShapeInferenceError(
                f"{s.to_text(False)} does not fit the {features} features of {operand.to_text(False)}"
            )
    if op.opcode == "batch-norm-inference":
        return operand
    per_feature = make_shape(operand.element_type, [features], [dynamic_dim(operand, feature_index)])
    return TupleShape((operand, per_feature, per_feature))


RULES: dict[str, Rule] = {
    "dot": _dot,
    "scaled-dot": _dot,
    "ragged-dot": _ragged_dot,
    "convolution": _convolution,
    "fft": _fft,
    "triangular-solve": _triangular_solve,
    "cholesky": _cholesky,
    "batch-norm-training": _batch_norm,
    "batch-norm-inference": _batch_norm,
    "batch-norm-grad": _batch_norm,
}

"""The shapes XLA's parser infers for instructions written without one.

XLA's HLO parser lets `x = add(a, b)` or `w = while(t), condition=c, body=b`
leave out the result shape and asks `ShapeInference` for it. `infer_shape`
gives the same answer for the same opcodes (jaxlib 0.7.1's set): the element
type and dims, the operand's layout where XLA keeps it and the default layout
where XLA builds a new shape. Opcodes outside that set (`convert`, `reshape`,
`slice`, collectives, ...) give None: the shape must be written. Operands
that do not fit raise `ShapeInferenceError` with XLA's reason.

Elementwise ops, tuples, control flow and reductions are here; data movement
and gather/scatter in `shape_inference_data`, contractions and linear
algebra in `shape_inference_linalg`.

Worked example: `broadcast(f32[4,8] p), dimensions={3,2}` with no shape. XLA
reads `dimensions` here as the sizes of new major dims (not as the operand's
place in the result), so the result is f32[3,2,4,8]{3,2,1,0}; written with a
shape, the same attribute means the operand's dims.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from planner.hlo.inference import data_movement as data
from planner.hlo.inference import linalg as linalg
from planner.hlo.inference.algebra import (
    COMPLEX_PART,
    SIGNED,
    Op,
    ProgramShape,
    ProgramShapeOf,
    Rule,
    ShapeInferenceError,
    compatible,
    dynamic_dim,
    expect_array,
    higher_precision,
    is_array,
    is_floating,
    is_integral,
    is_scalar,
    make_shape,
    retype,
    same_dims,
    same_type_ignoring_fp,
    unbounded,
    verify_reducer,
    window_output,
    with_default_layouts,
)
from planner.hlo.ir.module import Attribute
from planner.hlo.ir.opcodes import BINARY_ELEMENTWISE, UNARY_ELEMENTWISE
from planner.hlo.ir.shapes import ArrayShape, Shape, TupleShape

__all__ = ["ProgramShape", "ShapeInferenceError", "compatible", "infer_shape"]


def infer_shape(opcode: str, operand_shapes: Sequence[Shape], attributes: tuple[Attribute, ...],
                program_shape: ProgramShapeOf) -> Shape | None:  # fmt: skip
    """The shape XLA infers for `opcode`, None where XLA needs it written.

    Raises ShapeInferenceError where XLA's inference fails. The operand count
    must already be checked.
    """
    rule = _RULES.get(opcode)
    if rule is None:
        return None
    return with_default_layouts(rule(Op(opcode, operand_shapes, attributes, program_shape)))


_FLOAT_ONLY = frozenset({"floor", "ceil", "erf", "round-nearest-afz", "round-nearest-even"})
_FLOAT_OR_COMPLEX = frozenset(
    "cosine sine exponential exponential-minus-one log log-plus-one logistic rsqrt sqrt cbrt tan tanh".split()
)


def _unary(op: Op) -> Shape:
    shape = op.operands[0]
    if op.opcode in ("copy", "domain"):
        return shape
    s = expect_array(shape, "operand of unary operation")
    t, name = s.element_type, op.opcode
    if name in _FLOAT_ONLY or name == "is-finite":
        ok = is_floating(t)
    elif name in _FLOAT_OR_COMPLEX or name in ("real", "imag"):
        ok = is_floating(t) or t in COMPLEX_PART
    elif name == "abs":
        ok = t in COMPLEX_PART or is_floating(t) or t in SIGNED
    elif name in ("count-leading-zeros", "popcnt"):
        ok = is_integral(t)
    elif name == "negate":
        ok = is_integral(t) or is_floating(t) or t in COMPLEX_PART
    elif name == "sign":
        ok = t in SIGNED or is_floating(t) or t in COMPLEX_PART
    elif name == "not":
        ok = t == "pred" or is_integral(t)
    else:  # opt-barrier and the like: XLA's unary inference does not know them
        raise ShapeInferenceError(f'unknown operation for unary shape inference: "{name}"')
    if not ok:
        raise ShapeInferenceError(f"{name} does not take element type {t}")
    if name == "is-finite":
        return retype(s, "pred")
    if name in ("real", "imag", "abs") and t in COMPLEX_PART:
        return retype(s, COMPLEX_PART[t])
    return s


def _binary(op: Op) -> Shape:
    name = op.opcode
    lhs = op.array(0, f"lhs of binary operation {name}")
    rhs = op.array(1, f"rhs of binary operation {name}")
    arithmetic = name in ("subtract", "atan2", "power", "divide", "remainder") or name.startswith("shift-")
    if arithmetic and "pred" in (lhs.element_type, rhs.element_type):
        raise ShapeInferenceError(f"{name} needs an arithmetic element type, got pred")
    if name == "complex" and not is_floating(lhs.element_type):
        raise ShapeInferenceError(f"complex needs floating operands, got {lhs.element_type}")
    if name in ("and", "or", "xor") and not (lhs.element_type == "pred" or is_integral(lhs.element_type)):
        raise ShapeInferenceError(f"{name} needs pred or integral operands, got {lhs.element_type}")
    shape = elementwise_binary(name, lhs, rhs)
    if name == "compare":
        return retype(shape, "pred")
    if name == "complex":
        pair = (lhs.element_type, rhs.element_type)
        if pair not in (("f32", "f32"), ("f64", "f64")):
            raise ShapeInferenceError(f"complex of {pair[0]} and {pair[1]} is not implemented")
        return retype(shape, "c64" if pair[0] == "f32" else "c128")
    return shape


def elementwise_binary(name: str, lhs: ArrayShape, rhs: ArrayShape) -> ArrayShape:
    """InferElementwiseBinaryOpShape without broadcast dimensions: equal ranks, or a scalar side."""
    if not same_type_ignoring_fp(lhs, rhs):
        raise ShapeInferenceError(f"binary op {name} with different element types: "
                                  f"{lhs.to_text(False)} and {rhs.to_text(False)}")  # fmt: skip
    element_type = higher_precision(lhs.element_type, rhs.element_type)
    lhs_unbounded, rhs_unbounded = any(map(unbounded, lhs.dims)), any(map(unbounded, rhs.dims))
    if compatible(lhs, rhs, ignore_fp=True) and not lhs_unbounded and not rhs_unbounded:
        dynamic = [dynamic_dim(lhs, i) or dynamic_dim(rhs, i) for i in range(lhs.rank)]
        return dataclasses.replace(lhs, element_type=element_type, dynamic=tuple(dynamic) if any(dynamic) else ())
    if lhs.rank != rhs.rank:
        small, large = (lhs, rhs) if lhs.rank < rhs.rank else (rhs, lhs)
        if small.rank:
            raise ShapeInferenceError(f"shapes must be equal rank, but are {small.to_text(False)} and "
                                      f"{large.to_text(False)}")  # fmt: skip
        lhs, rhs = dataclasses.replace(large, element_type=element_type), large
    dims, dynamic = [], []
    for i, (a, b) in enumerate(zip(lhs.dims, rhs.dims)):
        if a == 1 or b == 1:
            dims.append(b if a == 1 else a)
            dynamic.append(dynamic_dim(rhs, i) if a == 1 else dynamic_dim(lhs, i))
        elif a == b:
            dims.append(a)
            dynamic.append(dynamic_dim(lhs, i) or dynamic_dim(rhs, i))
        elif unbounded(a) or unbounded(b):
            dims.append(b if unbounded(a) else a)
            dynamic.append(dynamic_dim(rhs, i) if unbounded(a) else dynamic_dim(lhs, i))
        else:
            raise ShapeInferenceError(f"binary op with incompatible shapes: {lhs.to_text(False)} and "
                                      f"{rhs.to_text(False)}")  # fmt: skip
    return make_shape(element_type, dims, dynamic)


def _clamp(op: Op) -> Shape:
    low, operand, high = op.array(0, "clamp min"), op.array(1, "clamp operand"), op.array(2, "clamp max")
    if not (same_type_ignoring_fp(low, operand) and same_type_ignoring_fp(high, operand)
            and same_type_ignoring_fp(low, high)):  # fmt: skip
        raise ShapeInferenceError("clamp with incompatible element types")
    for bound in (low, high):
        if bound.rank and not compatible(bound, operand, ignore_fp=True):
            raise ShapeInferenceError(f"clamp bound {bound.to_text(False)} does not fit {operand.to_text(False)}")
    if low.rank and high.rank and not compatible(low, high, ignore_fp=True):
        raise ShapeInferenceError("clamp bounds of different shapes")
    return operand


def _select(op: Op) -> Shape:
    pred, on_true, on_false = op.array(0, "select pred"), op.array(1, "select on-true"), op.array(2, "select on-false")
    if not compatible(on_true, on_false, ignore_fp=True):
        raise ShapeInferenceError(f"operands to select must be the same shape; got {on_true.to_text(False)} "
                                  f"and {on_false.to_text(False)}")  # fmt: skip
    if pred.element_type != "pred":
        raise ShapeInferenceError(f"select's predicate must be pred, got {pred.to_text(False)}")
    if pred.rank and not (compatible(pred, on_true, ignore_type=True) and compatible(pred, on_false, ignore_type=True)):
        raise ShapeInferenceError("select's predicate and operands must be the same shape")
    full = on_true if pred.rank == 0 else pred
    dims, dynamic = list(full.dims), []
    for i in range(full.rank):
        if unbounded(on_true.dims[i]) or unbounded(on_false.dims[i]):
            dims[i] = on_false.dims[i] if unbounded(on_true.dims[i]) else on_true.dims[i]
            dynamic.append(dynamic_dim(on_true, i) and dynamic_dim(on_false, i))
        else:
            by_pred = pred.rank > 0 and dynamic_dim(pred, i)
            dynamic.append(by_pred or dynamic_dim(on_true, i) or dynamic_dim(on_false, i))
    element_type = higher_precision(on_true.element_type, on_false.element_type)
    return dataclasses.replace(full, element_type=element_type, dims=tuple(dims),
                               dynamic=tuple(dynamic) if any(dynamic) else ())  # fmt: skip


def _get_tuple_element(op: Op) -> Shape:
    source, index = op.operands[0], op.int("index")
    if not isinstance(source, TupleShape):
        raise ShapeInferenceError(f"attempting to index into non-tuple {source.to_text(False)}")
    if not 0 <= index < len(source.elements):
        raise ShapeInferenceError(f"index {index} is out of the bounds of {source.to_text(False)}")
    return source.elements[index]


def _while(op: Op) -> Shape:
    (cond_params, cond_result), (body_params, body_result) = op.callee("condition"), op.callee("body")
    init = op.operands[0]
    if len(cond_params) != 1 or len(body_params) != 1:
        raise ShapeInferenceError("the condition and the body must each take 1 parameter")
    if not compatible(cond_result, ArrayShape("pred", ())):
        raise ShapeInferenceError(f"the condition must return pred[], not {cond_result.to_text(False)}")
    if not all(compatible(body_result, s) for s in (cond_params[0], body_params[0], init)):
        raise ShapeInferenceError(
            f"the parameter of condition and body, the result of the body and init must all have the same shape; "
            f"got body {body_params[0].to_text(False)} -> {body_result.to_text(False)}, init {init.to_text(False)}"
        )
    return init


def _call(op: Op) -> Shape:
    params, result = op.callee("to_apply")
    if len(params) != len(op.operands):
        raise ShapeInferenceError(f"the called computation takes {len(params)} parameters, given {len(op.operands)}")
    for i, (param, arg) in enumerate(zip(params, op.operands)):
        if not compatible(param, arg):
            raise ShapeInferenceError(f"parameter {i} is {param.to_text(False)}, the argument {arg.to_text(False)}")
    return result


def _conditional(op: Op) -> Shape:
    index = op.operands[0]
    branches = op.callees("branch_computations") or [op.callee("true_computation"), op.callee("false_computation")]
    if len(branches) != len(op.operands) - 1:
        raise ShapeInferenceError(f"{len(branches)} branches but {len(op.operands) - 1} branch operands")
    if not (compatible(index, ArrayShape("pred", ())) or compatible(index, ArrayShape("s32", ()))):
        raise ShapeInferenceError(f"branch_index must be pred[] or s32[], not {index.to_text(False)}")
    first = branches[0][1]
    for j, ((params, result), operand) in enumerate(zip(branches, op.operands[1:])):
        if len(params) != 1:
            raise ShapeInferenceError(f"branch computation {j} must take 1 parameter, takes {len(params)}")
        if not compatible(params[0], operand):
            raise ShapeInferenceError(f"branch operand {j} {operand.to_text(False)} does not match the parameter "
                                      f"{params[0].to_text(False)} of branch computation {j}")  # fmt: skip
        if not compatible(first, result):
            raise ShapeInferenceError(f"branch 0 returns {first.to_text(False)}, branch {j} {result.to_text(False)}")
    return _merge_dynamic(first, [result for _, result in branches])


def _merge_dynamic(shape: Shape, others: list[Shape]) -> Shape:
    """A dim dynamic in any branch's result is dynamic in the conditional's."""
    if isinstance(shape, TupleShape):
        return TupleShape(tuple(_merge_dynamic(e, [o.elements[i] for o in others])  # type: ignore[union-attr]
                                for i, e in enumerate(shape.elements)))  # fmt: skip
    if not is_array(shape) or not shape.rank:
        return shape
    dynamic = [any(dynamic_dim(o, i) for o in [shape, *others]) for i in range(shape.rank)]  # type: ignore[arg-type]
    return dataclasses.replace(shape, dynamic=tuple(dynamic) if any(dynamic) else ())


def _reduce(op: Op) -> Shape:
    count = len(op.operands) // 2
    inputs = [op.array(i) for i in range(count)]
    for i, s in enumerate(inputs[1:], 1):
        if not same_dims(inputs[0], s):
            raise ShapeInferenceError(f"reduced operand {i} {s.to_text(False)} differs from "
                                      f"{inputs[0].to_text(False)}")  # fmt: skip
    dims, arg = op.ints("dimensions"), inputs[0]
    if any(not 0 <= d < arg.rank for d in dims):
        raise ShapeInferenceError(f"reducing out-of-bounds dims {list(dims)} of {arg.to_text(False)}")
    reducer = op.callee("to_apply")
    verify_reducer(reducer, op.operands[count:], [s.element_type for s in inputs])
    if len(set(dims)) != len(dims):
        raise ShapeInferenceError(f"duplicate reduction dimension in {list(dims)}")
    kept = [i for i in range(arg.rank) if i not in dims]
    new_dims, new_dynamic = [arg.dims[i] for i in kept], [dynamic_dim(arg, i) for i in kept]
    results = reducer[1].elements if isinstance(reducer[1], TupleShape) else (reducer[1],)
    shapes = tuple(make_shape(r.element_type, new_dims, new_dynamic) for r in results)  # type: ignore[union-attr]
    return shapes[0] if isinstance(reducer[1], ArrayShape) else TupleShape(shapes)


def _reduce_window(op: Op) -> Shape:
    count = len(op.operands) // 2
    inputs = [op.array(i, "operand of reduce-window") for i in range(count)]
    for i, s in enumerate(inputs[1:], 1):
        if not same_dims(inputs[0], s):
            raise ShapeInferenceError(f"reduced operand {i} {s.to_text(False)} differs from "
                                      f"{inputs[0].to_text(False)}")  # fmt: skip
    reducer = op.callee("to_apply")
    inits = op.operands[count:]
    verify_reducer(reducer, inits, [s.element_type for s in inputs])
    window = op.attr("window", ())
    outputs = [window_output(s, window, op.array(count + i).element_type) for i, s in enumerate(inputs)]
    return outputs[0] if isinstance(reducer[1], ArrayShape) else TupleShape(tuple(outputs))


def _select_and_scatter(op: Op) -> Shape:
    operand, source, init = op.array(0, "operand of select-and-scatter"), op.operands[1], op.operands[2]
    select_params, select_result = op.callee("select")
    if len(select_params) != 2:
        raise ShapeInferenceError(f"the select function must take 2 parameters, takes {len(select_params)}")
    if not compatible(select_result, ArrayShape("pred", ())):
        raise ShapeInferenceError("the select function must return pred[]")
    element = ArrayShape(operand.element_type, ())
    if not all(compatible(element, p, ignore_fp=True) for p in select_params):
        raise ShapeInferenceError(f"the select function's parameters must be {element.to_text(False)}")
    verify_reducer(op.callee("scatter"), [init], [source.element_type])  # type: ignore[union-attr]
    windowed = window_output(operand, op.attr("window", ()), operand.element_type)
    if not compatible(source, windowed, ignore_fp=True):
        raise ShapeInferenceError(f"source {source.to_text(False)} does not match the windowed operand "
                                  f"{windowed.to_text(False)}")  # fmt: skip
    return operand


def _sort(op: Op) -> Shape:
    if len(op.operands) == 1:
        return op.operands[0]
    keys = op.array(0)
    for i in range(1, len(op.operands)):
        if not same_dims(keys, op.array(i)):
            raise ShapeInferenceError(f"sort keys {keys.to_text(False)} and values {i} "
                                      f"{op.operands[i].to_text(False)} differ in dims")  # fmt: skip
    return TupleShape(tuple(op.operands))


def _map(op: Op) -> Shape:
    shape = op.array(0)
    for i in range(1, len(op.operands)):
        s = op.array(i, "operand of map")
        if compatible(s, shape, ignore_type=True):
            continue
        if same_type_ignoring_fp(s, shape) and (s.rank == 0 or shape.rank == 0):
            shape = shape if s.rank == 0 else s
            continue
        raise ShapeInferenceError("map operands must all have the same shape")
    if op.attr("dimensions") is None or op.ints("dimensions") != tuple(range(shape.rank)):
        raise ShapeInferenceError(f"map needs dimensions={{0..{shape.rank - 1}}} (every dim, in order)")
    params, result = op.callee("to_apply")
    if len(params) != len(op.operands):
        raise ShapeInferenceError(f"the mapped computation takes {len(params)} parameters, given {len(op.operands)}")
    if not is_scalar(result) or not all(is_scalar(p) for p in params):
        raise ShapeInferenceError("the mapped computation must take and return scalars")
    for i, p in enumerate(params):
        if not same_type_ignoring_fp(expect_array(p, "a mapped parameter"), op.array(i)):
            raise ShapeInferenceError(f"the mapped computation's parameter {p.to_text(False)} does not fit "
                                      f"{op.operands[i].to_text(False)}")  # fmt: skip
    element_type = expect_array(result, "the mapped result").element_type
    return make_shape(element_type, shape.dims, [dynamic_dim(shape, i) for i in range(shape.rank)])


def _topk(op: Op) -> Shape:
    operand, k = op.array(0, "operand of top-k"), op.int("k")
    if not operand.rank or operand.dims[-1] < k:
        raise ShapeInferenceError(f"k={k} is larger than the last dim of {operand.to_text(False)}")
    dims = (*operand.dims[:-1], k)
    dynamic = [dynamic_dim(operand, i) for i in range(operand.rank - 1)] + [False]
    return TupleShape((make_shape(operand.element_type, dims, dynamic), make_shape("s32", dims, dynamic)))


_RULES: dict[str, Rule] = {
    **{op: _unary for op in UNARY_ELEMENTWISE - {"convert", "bitcast-convert", "reduce-precision"}},
    **{op: _binary for op in BINARY_ELEMENTWISE - {"stochastic-convert"}},
    "domain": _unary,
    "opt-barrier": _unary,
    "clamp": _clamp,
    "select": _select,
    "tuple": lambda op: TupleShape(tuple(op.operands)),
    "get-tuple-element": _get_tuple_element,
    "while": _while,
    "call": _call,
    "conditional": _conditional,
    "after-all": lambda op: ArrayShape("token", ()),
    "add-dependency": lambda op: op.operands[0],
    "partition-id": lambda op: ArrayShape("u32", ()),
    "replica-id": lambda op: ArrayShape("u32", ()),
    "reduce": _reduce,
    "reduce-window": _reduce_window,
    "select-and-scatter": _select_and_scatter,
    "sort": _sort,
    "map": _map,
    "topk": _topk,
    **data.RULES,
    **linalg.RULES,
}

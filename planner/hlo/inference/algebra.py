"""The vocabulary XLA's ShapeInference works in, for `shape_inference`.

Element type classes and precedence (primitive_util), shape compatibility
(ShapeUtil::Compatible and its variants), new shapes with XLA's default
layout, the window arithmetic shared by reduce-window, select-and-scatter
and convolution, and `Op`: one instruction being inferred, with its operand
shapes, typed attributes and a way to look up a called computation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from planner.hlo.ir.attributes import ComputationRefs, WindowDim
from planner.hlo.ir.module import Attribute
from planner.hlo.ir.shapes import ELEMENT_BITS, ArrayShape, Shape, TupleShape

# A called computation's parameters (by number) and root shape, and how to look one up by name.
ProgramShape = tuple[tuple[Shape, ...], Shape]
ProgramShapeOf = Callable[[str], ProgramShape]


class ShapeInferenceError(ValueError):
    """XLA would infer this opcode's shape, but its operands or attributes do not fit."""


# (overflow exponent, significand bits) of each floating type, as primitive_util ranks them.
_FLOAT_RANGE = {
    "f64": (1024, 53), "f32": (128, 24), "bf16": (128, 8), "f16": (16, 11),
    "f8e5m2": (16, 3), "f8e5m2fnuz": (16, 3), "f8e4m3fn": (9, 4), "f8e4m3": (8, 4),
    "f8e4m3fnuz": (8, 4), "f8e4m3b11fnuz": (5, 4), "f8e3m4": (4, 5), "f4e2m1fn": (3, 2),
    "f8e8m0fnu": (128, 1),
}  # fmt: skip
COMPLEX_PART = {"c64": "f32", "c128": "f64"}
SIGNED = frozenset("s1 s2 s4 s8 s16 s32 s64".split())
_UNSIGNED = frozenset("u1 u2 u4 u8 u16 u32 u64".split())
_BITS = {**{t: int(t[1:]) for t in SIGNED | _UNSIGNED}, "pred": 1}


def is_floating(t: str) -> bool:
    return t in _FLOAT_RANGE


def is_integral(t: str) -> bool:
    return t in SIGNED or t in _UNSIGNED


def higher_precision(a: str, b: str) -> str:
    """primitive_util::HigherPrecisionType: complex, then range, precision, width, signedness."""

    def rank(t: str) -> tuple[bool, int, int, int, bool]:
        part = COMPLEX_PART.get(t, t)
        exponent, significand = _FLOAT_RANGE.get(part, (-1, -1))
        return t in COMPLEX_PART, exponent, significand, _BITS.get(part, 0), part in SIGNED

    return a if rank(a) >= rank(b) else b


def is_array(s: Shape) -> bool:
    return isinstance(s, ArrayShape) and s.element_type not in ("token", "opaque")


def expect_array(s: Shape, what: str) -> ArrayShape:
    if not is_array(s):
        raise ShapeInferenceError(f"expected an array for {what}, got {s.to_text(False)}")
    return s  # type: ignore[return-value]


def dynamic_dim(s: ArrayShape, i: int) -> bool:
    return bool(s.dynamic) and s.dynamic[i]


def unbounded(size: int) -> bool:
    return size < 0


def make_shape(element_type: str, dims: Sequence[int], dynamic: Sequence[bool] = ()) -> ArrayShape:
    """A new shape, as ShapeUtil::MakeShape builds it (default layout)."""
    flags = tuple(dynamic) if any(dynamic) else ()
    return ArrayShape(element_type, tuple(dims), flags, default_layout(len(dims)))


def retype(s: ArrayShape, element_type: str) -> ArrayShape:
    """ShapeUtil::ChangeElementType: same dims and layout."""
    return dataclasses.replace(s, element_type=element_type)


def default_layout(rank: int) -> str | None:
    """XLA's default (major-to-minor) layout as it prints it; scalars print none."""
    return "{" + ",".join(map(str, range(rank - 1, -1, -1))) + "}" if rank else None


def with_default_layouts(shape: Shape) -> Shape:
    if isinstance(shape, TupleShape):
        return TupleShape(tuple(map(with_default_layouts, shape.elements)))
    if shape.layout is None and is_array(shape) and shape.rank:
        return dataclasses.replace(shape, layout=default_layout(shape.rank))
    return shape


def compatible(a: Shape, b: Shape, *, ignore_fp: bool = False, ignore_type: bool = False) -> bool:
    """ShapeUtil::Compatible and its variants: layouts and dynamism aside; `?` matches any size."""
    if a is b:  # the parser caches shapes by their text: alike spellings are one object
        return True
    if isinstance(a, TupleShape) or isinstance(b, TupleShape):
        return (
            isinstance(a, TupleShape)
            and isinstance(b, TupleShape)
            and len(a.elements) == len(b.elements)
            and all(
                x is y or compatible(x, y, ignore_fp=ignore_fp, ignore_type=ignore_type)
                for x, y in zip(a.elements, b.elements)
            )
        )
    if not is_array(a) or not is_array(b):
        return a.element_type == b.element_type
    if not (ignore_type or a.element_type == b.element_type or (ignore_fp and same_type_ignoring_fp(a, b))):
        return False
    return a.rank == b.rank and all(x == y or unbounded(x) or unbounded(y) for x, y in zip(a.dims, b.dims))


def same_type_ignoring_fp(a: ArrayShape, b: ArrayShape) -> bool:
    return a.element_type == b.element_type or (is_floating(a.element_type) and is_floating(b.element_type))


def is_scalar(s: Shape) -> bool:
    return is_array(s) and s.rank == 0  # type: ignore[union-attr]


def same_dims(a: ArrayShape, b: ArrayShape) -> bool:
    return compatible(a, b, ignore_type=True)


def compatible_size(a: int, b: int) -> bool:
    return a == b or unbounded(a) or unbounded(b)


def check_size(element_type: str, dims: Sequence[int]) -> None:
    """ShapeUtil::MakeValidatedShape: the byte size must fit in an int64."""
    product = 1
    for d in dims:
        if not unbounded(d):
            product *= d
            if product >= 1 << 63:
                raise ShapeInferenceError(f"shape {element_type}{list(dims)} overflows int64")
    if product * ((ELEMENT_BITS[element_type] + 7) // 8) >= 1 << 63:
        raise ShapeInferenceError(f"shape {element_type}{list(dims)} size overflows int64")


class Op:
    """One instruction being inferred: operands, typed attributes, callee lookup."""

    def __init__(self, opcode: str, operands: Sequence[Shape], attributes: tuple[Attribute, ...],
                 program_shape: ProgramShapeOf) -> None:  # fmt: skip
        self.opcode = opcode
        self.operands = operands
        self._attributes = {a.key: a.value for a in attributes}
        self._program_shape = program_shape

    def array(self, i: int, what: str = "") -> ArrayShape:
        return expect_array(self.operands[i], what or f"operand {i} of {self.opcode}")

    def attr(self, key: str, default: Any = None) -> Any:
        return self._attributes.get(key, default)

    def ints(self, key: str) -> tuple[int, ...]:
        value = self._attributes.get(key, ())
        if not isinstance(value, tuple) or not all(isinstance(v, int) for v in value):
            raise ShapeInferenceError(f"{self.opcode} needs {key}={{...}}")
        return value

    def int(self, key: str, default: int | None = None) -> int:
        value = self._attributes.get(key, default)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = getattr(value, "text", None)  # unmodelled attributes are kept raw
        if isinstance(text, str) and text.lstrip("-").isdigit():
            return int(text)
        raise ShapeInferenceError(f"{self.opcode} needs {key}=N")

    def callee(self, key: str) -> ProgramShape:
        refs = self._attributes.get(key)
        if not isinstance(refs, ComputationRefs) or len(refs.names) != 1:
            raise ShapeInferenceError(f"{self.opcode} needs {key}=<computation>")
        return self._program_shape(refs.names[0])

    def callees(self, key: str) -> list[ProgramShape]:
        refs = self._attributes.get(key)
        return [self._program_shape(name) for name in refs.names] if isinstance(refs, ComputationRefs) else []


Rule = Callable[[Op], Shape]


def verify_reducer(reducer: ProgramShape, inits: Sequence[Shape], input_types: Sequence[str]) -> None:
    """VerifyReducerShape: (acc..., x...) -> acc, all scalars of the inputs' element types."""
    params, result = reducer
    count = len(input_types)
    if len(params) != 2 * count:
        raise ShapeInferenceError(f"the reduction function must take {2 * count} parameters, takes {len(params)}")
    accumulators = list(result.elements) if isinstance(result, TupleShape) else [result]
    if isinstance(result, ArrayShape) and count != 1:
        raise ShapeInferenceError(f"the reduction function must return a tuple of {count} scalars")
    if len(accumulators) != count or not all(is_scalar(a) for a in accumulators):
        raise ShapeInferenceError(f"the reduction function must return {count} scalars, not {result.to_text(False)}")
    for i, (acc, init, element_type) in enumerate(zip(accumulators, inits, input_types)):
        if not compatible(acc, params[i]):
            raise ShapeInferenceError(f"the reduction function's parameter {i} differs from its result")
        if not compatible(acc, init, ignore_fp=True):
            raise ShapeInferenceError(f"init value {init.to_text(False)} does not fit the accumulator "
                                      f"{acc.to_text(False)}")  # fmt: skip
        if not compatible(ArrayShape(element_type, ()), params[count + i], ignore_fp=True):
            raise ShapeInferenceError(f"the reduction function's parameter {count + i} is not {element_type}[]")
        if not compatible(acc, params[count + i], ignore_fp=True):
            raise ShapeInferenceError(f"the reduction function's parameter {count + i} differs from its result")


def window_output(base: ArrayShape, window: Sequence[WindowDim], element_type: str) -> ArrayShape:
    """InferWindowOutputShape: the number of window positions along each dim."""
    if len(window) != base.rank:
        raise ShapeInferenceError(f"the window has {len(window)} dims but the base shape {base.to_text(False)} "
                                  f"has {base.rank}")  # fmt: skip
    dims = []
    for size, w in zip(base.dims, window):
        if w.size <= 0 or w.stride <= 0 or w.lhs_dilate < 1 or w.rhs_dilate < 1:
            raise ShapeInferenceError("window sizes, strides and dilations must be positive")
        if unbounded(size):
            dims.append(size)
            continue
        padded = w.pad_low + _dilated(size, w.lhs_dilate) + w.pad_high
        window_size = _dilated(w.size, w.rhs_dilate)
        if padded < 0:  # XLA's StridedBound CHECK-fails here
            raise ShapeInferenceError(f"padding leaves a negative extent ({padded}) to slide the window over")
        dims.append(0 if padded == 0 or window_size > padded else (padded - window_size) // w.stride + 1)
    return make_shape(element_type, dims, [dynamic_dim(base, i) for i in range(base.rank)])


def _dilated(size: int, dilation: int) -> int:
    return 0 if size == 0 else (size - 1) * dilation + 1

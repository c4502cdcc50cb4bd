"""Checks and inference on one instruction, shared by both parse paths.

These are the checks XLA's parser makes as it reads (operand counts, tuple
indices, constant literals, the shapes it infers for instructions written
without one, by `shape_inference`) plus the sharding/shape fit XLA's
verifier makes, so that a bad module fails at the line that is wrong.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache

from planner.hlo.inference import shapes as shape_inference
from planner.hlo.inference.shapes import ProgramShape, ShapeInferenceError
from planner.hlo.ir.module import Attribute
from planner.hlo.ir.opcodes import arity_problem
from planner.hlo.ir.shapes import ELEMENT_BITS, ArrayShape, Shape, TupleShape
from planner.hlo.text.parse_state import ParseState
from planner.sharding.hlo_sharding import HloSharding


def infer_shape(
    state: ParseState, opcode: str, operand_shapes: list[Shape], attributes: tuple[Attribute, ...], pos: int
) -> Shape:
    """The shape of an instruction written without one, as XLA's parser infers it; fails at `pos` otherwise."""
    c = state.cursor
    problem = arity_problem(opcode, len(operand_shapes))
    if problem:
        c.fail(problem, pos)

    def program_shape(name: str) -> ProgramShape:
        callee = state.computations.get(name)
        if callee is None:
            c.fail(f"computation '{name}' is not defined before its use", pos)
        return tuple(p.shape for p in callee.parameters), callee.root.shape

    try:
        shape = shape_inference.infer_shape(opcode, operand_shapes, attributes, program_shape)
    except ShapeInferenceError as e:
        c.fail(f"cannot infer the shape of this {opcode}: {e}", pos)
    if shape is None:
        c.fail(f"cannot infer the shape of this {opcode}; write its shape before the opcode", pos)
    return shape


def tuple_index_problem(index: object, source: Shape, operand: str) -> str | None:
    if not isinstance(index, int):
        return "get-tuple-element needs index=N"
    if not isinstance(source, TupleShape) or not 0 <= index < len(source.elements):
        arity = len(source.elements) if isinstance(source, TupleShape) else "no"
        return f"get-tuple-element index {index} is out of range: '{operand}' has {arity} tuple elements"
    return None


def same_shape(a: Shape, b: Shape) -> bool:
    """Equal but for layouts. Shapes spelt alike are one object (the parser caches them): that is checked first."""
    if a is b:
        return True
    if isinstance(a, ArrayShape) and isinstance(b, ArrayShape):
        return a.element_type == b.element_type and a.dims == b.dims and a.dynamic == b.dynamic
    if isinstance(a, TupleShape) and isinstance(b, TupleShape):
        return len(a.elements) == len(b.elements) and all(map(same_shape, a.elements, b.elements))
    return False


def tuple_shape_problem(shape: Shape, operand_shapes: list[Shape]) -> str | None:
    """A tuple's declared shape must be its operands' shapes (layouts aside), as XLA's verifier requires."""
    if not isinstance(shape, TupleShape):
        return f"a tuple has a tuple shape, not {shape.to_text()}"
    if len(shape.elements) != len(operand_shapes):
        return f"tuple has {len(operand_shapes)} operands but its shape has {len(shape.elements)} elements"
    for i, (declared, given) in enumerate(zip(shape.elements, operand_shapes)):
        if not same_shape(declared, given):
            return f"tuple element {i} is declared {declared.to_text(False)} but its operand is {given.to_text(False)}"
    return None


def fit_sharding(attributes: tuple[Attribute, ...], shape: Shape) -> tuple[tuple[Attribute, ...], str | None]:
    """Checks a sharding against the shape and expands it over tuples.

    As in XLA's parser, one non-tuple sharding on a tuple-shaped instruction
    stands for every leaf (`{replicated}` on a 3-tuple is three
    `{replicated}`). Returns the attributes and a problem, if any.
    """
    for i, attribute in enumerate(attributes):
        if attribute.key != "sharding":
            continue
        sharding = attribute.value
        problem = sharding_shape_problem(sharding, shape)
        if problem:
            return attributes, problem
        if isinstance(shape, TupleShape) and not sharding.is_tuple:
            count = max(len(shape.leaves()), 1)
            expanded = Attribute("sharding", HloSharding.tuple_of((sharding,) * count), attribute.text)
            return (*attributes[:i], expanded, *attributes[i + 1 :]), None
    return attributes, None


def sharding_shape_problem(sharding: HloSharding, shape: Shape) -> str | None:
    """Why `sharding` cannot apply to `shape`, or None when it can.

    A tuple sharding on an array-shaped instruction is left alone: ops such as
    outfeed carry the sharding of their operand tuple.
    """
    if sharding.is_tuple:
        if not isinstance(shape, TupleShape):
            return None
        leaves = shape.leaves()
        if len(sharding.elements) != max(len(leaves), 1):
            return f"{len(sharding.elements)} tuple entries for {len(leaves)} leaf arrays"
        return next(filter(None, (sharding_shape_problem(e, leaf) for e, leaf in zip(sharding.elements, leaves))), None)
    if isinstance(shape, TupleShape):
        if sharding.is_tiled:
            return f"a tiled sharding cannot apply to the tuple {shape.to_text()}"
        return None
    if sharding.is_tiled and sharding.tiled_data_rank != shape.rank:
        return f"{sharding.tiled_data_rank} tiled dims but {shape.to_text()} has rank {shape.rank}"
    return None


# --- constant literals ---------------------------------------------------------------------------

_LITERAL_TOKEN = re.compile(
    r"\.\.\.|[{}(),]|-?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?(?![\w.])|-?inf\b|-?nan\b|true\b|false\b|\S"
)
_COMMENT = re.compile(r"/\*.*?\*/", re.S)
# Floating literals XLA takes: those that round (to nearest, ties to even) to a finite value of the type.
# Per type: the largest finite value plus half its ulp, and whether that tie rounds down (an even
# mantissa at the max, as in f8e4m3fn's 448) or up, past the max.
_FLOAT_LIMIT = {
    "f64": (math.inf, False), "f32": (2.0**128 - 2.0**103, False), "bf16": (2.0**128 - 2.0**119, False),
    "f16": (65520.0, False), "f8e5m2": (61440.0, False), "f8e5m2fnuz": (61440.0, False),
    "f8e4m3fn": (464.0, True), "f8e4m3": (248.0, False), "f8e4m3fnuz": (248.0, False),
    "f8e4m3b11fnuz": (31.0, False), "f8e3m4": (15.75, False), "f4e2m1fn": (7.0, False),
    "f8e8m0fnu": (2.0**127 * 1.5, False),
}  # fmt: skip


@lru_cache(maxsize=4096)
def literal_problem(shape: Shape, text: str) -> str | None:
    """Why XLA's parser refuses `text` as a constant of `shape`, or None.

    XLA reads a literal by its shape: nested braces as deep as the rank with
    as many elements as each dim (commas optional; `{...}` for elided data; a
    lone value for any array), numbers of the element type and within its
    range, `(re, im)` for complex elements, `(a, b)` for tuples.
    """
    tokens = _LITERAL_TOKEN.findall(_COMMENT.sub(" ", text))
    bad = next((t for t in tokens if len(t) == 1 and t not in "{}(),0123456789"), None)
    if bad is not None:
        return f"unexpected '{bad}' in the literal"
    if tokens == [","] and isinstance(shape, ArrayShape):
        return None  # XLA's dense-literal loop takes a lone comma, for all zeros
    try:
        rest = _read_literal(shape, tokens, 0)
    except ValueError as e:
        return str(e)
    return None if rest == len(tokens) else f"unexpected '{tokens[rest]}' after the literal"


def _read_literal(shape: Shape, tokens: list[str], i: int) -> int:
    """Reads one literal of `shape` from tokens[i:]; returns the index after it, or raises ValueError."""
    if isinstance(shape, TupleShape):
        _expect(tokens, i, "(")
        i += 1
        for n, element in enumerate(shape.elements):
            if n:
                _expect(tokens, i, ",")
                i += 1
            i = _read_literal(element, tokens, i)
        _expect(tokens, i, ")")
        return i + 1
    if shape.element_type in ("token", "opaque"):
        raise ValueError(f"a {shape.element_type} has no literal")
    if shape.rank == 0 or (i < len(tokens) and tokens[i] not in ("{", "...")):
        return _read_value(shape.element_type, tokens, i)
    _expect(tokens, i, "{")
    if tokens[i + 1 : i + 3] == ["...", "}"]:
        return i + 3
    counts, depth, i = [0], 1, i + 1
    while depth:
        token = tokens[i] if i < len(tokens) else ""
        if token == "{":
            if depth == shape.rank:
                raise ValueError(f"expects nested array in rank {shape.rank}, but sees larger")
            counts[-1] += 1
            counts.append(0)
            depth, i = depth + 1, i + 1
        elif token == "}":
            if counts.pop() != shape.dims[depth - 1] and shape.dims[depth - 1] >= 0:
                raise ValueError(f"expects {shape.dims[depth - 1]} elements in dim {depth - 1}")
            depth, i = depth - 1, i + 1
        elif token == ",":
            i += 1
        elif depth < shape.rank:
            raise ValueError(f"expects nested array in rank {shape.rank}, but sees {depth}")
        else:
            counts[-1] += 1
            i = _read_value(shape.element_type, tokens, i)
    return i


def _read_value(element_type: str, tokens: list[str], i: int) -> int:
    if element_type in ("c64", "c128"):
        part = "f32" if element_type == "c64" else "f64"
        _expect(tokens, i, "(")
        i = _read_value(part, tokens, i + 1)
        _expect(tokens, i, ",")
        i = _read_value(part, tokens, i + 1)
        _expect(tokens, i, ")")
        return i + 1
    token = tokens[i] if i < len(tokens) else "the end of the literal"
    is_int = token.lstrip("-").isdigit()
    if element_type == "pred":
        ok = token in ("true", "false") or is_int
    elif element_type in _FLOAT_LIMIT:
        limit, tie_rounds_down = _FLOAT_LIMIT[element_type]
        number = token[0].isdigit() or (token[:1] == "-" and token[1:2].isdigit())
        size = abs(float(token)) if number else math.inf
        ok = token.lstrip("-") in ("inf", "nan") or size < limit or (size == limit and tie_rounds_down)
    else:
        bits = ELEMENT_BITS[element_type]
        low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if element_type[0] == "s" else (0, (1 << bits) - 1)
        high = (1 << 64) - 1 if element_type == "s64" else high  # XLA reads it as a uint64 first
        ok = is_int and low <= int(token) <= high
    if not ok:
        raise ValueError(f"{token} is not a {element_type} value")
    return i + 1


def _expect(tokens: list[str], i: int, token: str) -> None:
    if i >= len(tokens) or tokens[i] != token:
        raise ValueError(f"expects '{token}' in the literal, sees {tokens[i] if i < len(tokens) else 'its end'}")

"""Checks and inference on one instruction, shared by both parse paths.

These are the checks XLA's parser makes as it reads (operand counts, tuple
indices, shapes it can infer) plus the sharding/shape fit XLA's verifier
makes, so that a bad module fails at the line that is wrong.
"""

from __future__ import annotations

from planner.hlo.ir import Attribute
from planner.hlo.opcodes import BINARY_ELEMENTWISE, UNARY_ELEMENTWISE
from planner.hlo.shapes import ArrayShape, Shape, TupleShape
from planner.sharding.hlo_sharding import HloSharding

# Unary ops whose result element type differs from the operand's.
_TYPE_CHANGING = frozenset({"convert", "bitcast-convert", "real", "imag", "is-finite"})


def infer_shape(opcode: str, operand_shapes: list[Shape], attributes: tuple[Attribute, ...]) -> Shape | None:
    """The shape of an instruction written without one, where XLA infers it."""
    if opcode == "tuple":
        return TupleShape(tuple(operand_shapes))
    first = operand_shapes[0] if operand_shapes else None
    if isinstance(first, ArrayShape):
        if (opcode in UNARY_ELEMENTWISE and opcode not in _TYPE_CHANGING) or (
            opcode in BINARY_ELEMENTWISE and opcode not in ("compare", "complex")
        ):
            return first
        if opcode == "compare":
            return ArrayShape("pred", first.dims, first.dynamic)
    if opcode == "get-tuple-element" and isinstance(first, TupleShape):
        index = next((a.value for a in attributes if a.key == "index"), None)
        if isinstance(index, int) and 0 <= index < len(first.elements):
            return first.elements[index]
    return None


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

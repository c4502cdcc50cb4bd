"""Shapes: element types, dims, layouts and byte sizes."""

from __future__ import annotations

import pytest

from planner.hlo.ir.shapes import ArrayShape, TupleShape, parse_shape
from planner.scanner import Cursor


def shape_of(text: str):
    return parse_shape(Cursor(text), {})


@pytest.mark.parametrize(
    "text,element_type,dims,byte_size",
    [
        ("f32[8,1024,4096]{2,1,0}", "f32", (8, 1024, 4096), 134_217_728),
        ("bf16[126,16384,4096]", "bf16", (126, 16384, 4096), 16_911_433_728),
        ("f32[]", "f32", (), 4),
        ("pred[3]", "pred", (3,), 3),
        ("s4[5]{0}", "s4", (5,), 5),  # unpacked: one byte each
        ("s4[5]{0:E(4)}", "s4", (5,), 3),  # packed by the layout
        ("f32[<=8,16]", "f32", (8, 16), 512),  # bounded dynamic: sized at the bound
        ("token[]", "token", (), 0),
        ("f32[8,128]{1,0:T(8,128)}", "f32", (8, 128), 4096),
        ("f8e4m3fn[16]", "f8e4m3fn", (16,), 16),
    ],
)
def test_array_shapes(text: str, element_type: str, dims: tuple[int, ...], byte_size: int) -> None:
    shape = shape_of(text)
    assert isinstance(shape, ArrayShape)
    assert (shape.element_type, shape.dims, shape.byte_size) == (element_type, dims, byte_size)
    assert shape_of(shape.to_text()) == shape


def test_tuple_shapes_nest_and_print_index_comments() -> None:
    text = "(s64[], (f32[2]{0}, ()), f32[3], f32[4], f32[5], /*index=5*/f32[6])"
    shape = shape_of(text)
    assert isinstance(shape, TupleShape)
    assert len(shape.elements) == 6
    assert shape.element((1, 0)) == ArrayShape("f32", (2,), (), "{0}")
    assert shape.element((1, 1)) == TupleShape(())
    assert [leaf.dims for leaf in shape.leaves()] == [(), (2,), (3,), (4,), (5,), (6,)]
    assert shape.to_text() == text
    assert shape.byte_size == 8 + 4 * (2 + 3 + 4 + 5 + 6)


def test_unknown_element_type_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown element type"):
        ArrayShape("f33", (2,))

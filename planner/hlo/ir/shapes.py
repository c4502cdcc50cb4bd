"""HLO shapes: element types, arrays with layouts, tuples, and their byte sizes.

Worked example of the byte math: `f32[8,1024,4096]{2,1,0}` holds
8 * 1024 * 4096 = 33,554,432 elements of 4 bytes = 134,217,728 bytes. Sharded
`{devices=[1,4,2]<=[8]}` each device holds `f32[8,256,2048]`, 16,777,216 bytes
(see `planner.sharding` for the shard shape).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from planner.scanner import Cursor

# Bits per element, as XLA's primitive_util gives them. Sub-byte types take a
# whole byte each unless the layout packs them (`E(4)`).
ELEMENT_BITS: dict[str, int] = {
    "pred": 8,
    "s1": 1, "s2": 2, "s4": 4, "s8": 8, "s16": 16, "s32": 32, "s64": 64,
    "u1": 1, "u2": 2, "u4": 4, "u8": 8, "u16": 16, "u32": 32, "u64": 64,
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64,
    "c64": 64, "c128": 128,
    "f4e2m1fn": 4,
    "f8e3m4": 8, "f8e4m3": 8, "f8e4m3fn": 8, "f8e4m3b11fnuz": 8, "f8e4m3fnuz": 8,
    "f8e5m2": 8, "f8e5m2fnuz": 8, "f8e8m0fnu": 8,
    "token": 0,
    # An opaque value is a pointer on the host.
    "opaque": 64,
}  # fmt: skip

_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([^\]\n]*)\]")
# A layout follows the dims directly. `-> f32[] {` opens a computation body,
# so a spaced brace only counts as a layout when it starts like one.
_LAYOUT = r"\{[^{}\n]*\}|\s+\{(?=\s*[\d:])[^{}\n]*\}"
_ARRAY_WITH_LAYOUT = re.compile(rf"{_ARRAY.pattern}({_LAYOUT})?")
_PLAIN_DIMS = re.compile(r"[0-9]+(?:,[0-9]+)*")
# One element of a tuple written plainly (an array with its layout, perhaps after an index
# comment) and the ',' or ')' after it; anything else is read step by step.
_PLAIN_ELEMENT = re.compile(r"[ \t]*(?:/\*index=\d+\*/)?([a-z][a-z0-9]*\[[^\]\n]*\](?:\{[^{}\n]*\})?)[ \t]*([,)])")
_PACKED_BITS = re.compile(r"E\((\d+)\)")
# What XLA reads after the ':' of a layout, in its order: dim level types, tiles, tail padding, index
# and pointer types, element bits, memory space, split configs, metadata prefix bytes.
_LAYOUT_TAIL = re.compile(
    r"\s*(?:D\([^()]*\))?\s*(?:T(?:\s*\((?:\s*(?:\d+|\*)(?:\s*,\s*(?:\d+|\*))*)?\s*\))*)?"
    r"\s*(?:L\(\s*\d+\s*\)?)?\s*(?:#\(\s*u\d+\s*\))?\s*(?:\*\(\s*u\d+\s*\))?\s*(?:E\(\s*\d+\s*\)?)?"
    r"\s*(?:S\(\s*\d+\s*\)?)?\s*(?:SC(?:\(\s*\d+\s*:[\d,\s]*\))*)?\s*(?:M\(\s*\d+\s*\)?)?\s*"
)
_DIM = re.compile(r"\s*(?:(\d+)|<=\s*(\d+)|(\?))\s*$")
_TUPLE_PARENS = re.compile(r"[()]")


@dataclass(frozen=True, slots=True)
class ArrayShape:
    """An array: element type, dims, and the layout text as written.

    `dynamic[i]` marks `<=N` (bounded) and `?` (unbounded, stored as -1) dims.
    """

    element_type: str
    dims: tuple[int, ...]
    dynamic: tuple[bool, ...] = ()
    layout: str | None = field(default=None)

    def __post_init__(self) -> None:
        if self.element_type not in ELEMENT_BITS:
            raise ValueError(f"unknown element type {self.element_type!r}")
        if self.dynamic and len(self.dynamic) != len(self.dims):
            raise ValueError(f"dynamic={self.dynamic} does not match dims={self.dims}")

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def num_elements(self) -> int:
        return math.prod(max(d, 0) for d in self.dims)

    @property
    def element_bits(self) -> int:
        bits = ELEMENT_BITS[self.element_type]
        if self.layout:
            packed = _PACKED_BITS.search(self.layout)
            if packed:
                return int(packed.group(1))
        return bits

    @property
    def byte_size(self) -> int:
        """Bytes of the array at its full (unsharded) size."""
        return self.bytes_for_dims(self.dims)

    def bytes_for_dims(self, dims: tuple[int, ...]) -> int:
        """Bytes of an array of this element type and layout with `dims`."""
        # The memory model sizes every value of every simulation here: the common case (a whole-byte
        # type, no packing in the layout) skips the layout search.
        bits = ELEMENT_BITS[self.element_type]
        count = 1
        for d in dims:
            count *= d if d > 0 else 0
        if bits >= 8 and (self.layout is None or "E(" not in self.layout):
            return (count * bits + 7) // 8
        bits = self.element_bits
        if bits == 0:
            return 0
        if self.element_type != "opaque" and bits < 8 and not (self.layout and _PACKED_BITS.search(self.layout)):
            bits = 8
        return (count * bits + 7) // 8

    def to_text(self, with_layout: bool = True) -> str:
        parts = []
        for d, dyn in zip(self.dims, self.dynamic or (False,) * len(self.dims)):
            parts.append(("?" if d < 0 else f"<={d}") if dyn else str(d))
        text = f"{self.element_type}[{','.join(parts)}]"
        if with_layout and self.layout is not None:
            text += self.layout
        return text

    def leaves(self) -> tuple[ArrayShape, ...]:
        return (self,)


@dataclass(frozen=True, slots=True)
class TupleShape:
    """A tuple of shapes; `()` is the empty tuple."""

    elements: tuple[Shape, ...]

    @property
    def byte_size(self) -> int:
        """Bytes of all leaf arrays (the tuple's pointer table is not included)."""
        return sum(e.byte_size for e in self.elements)

    def to_text(self, with_layout: bool = True) -> str:
        parts = []
        for i, e in enumerate(self.elements):
            # XLA marks every fifth element so long tuples stay navigable.
            prefix = f"/*index={i}*/" if i and i % 5 == 0 else ""
            parts.append(prefix + e.to_text(with_layout))
        return "(" + ", ".join(parts) + ")"

    def leaves(self) -> tuple[ArrayShape, ...]:
        return tuple(leaf for e in self.elements for leaf in e.leaves())

    def element(self, index: tuple[int, ...]) -> Shape:
        shape: Shape = self
        for i in index:
            if not isinstance(shape, TupleShape) or not 0 <= i < len(shape.elements):
                raise ValueError(f"tuple index {index} does not exist in {self.to_text()}")
            shape = shape.elements[i]
        return shape


Shape = ArrayShape | TupleShape


def parse_optional_shape(cursor: Cursor, cache: dict[str, Shape]) -> Shape | None:
    """Reads a shape at the cursor, or returns None when none starts there.

    Shapes repeat heavily in real dumps (every get-tuple-element of a While
    repeats its tuple type), so each distinct text is parsed once per `cache`.
    """
    text = cursor.text
    pos = cursor.skip_space()
    m = _ARRAY_WITH_LAYOUT.match(text, pos)
    if m is not None:
        # A text in the cache was read whole before: its element type is known.
        cached = cache.get(m.group(0))
        if cached is None:
            if m.group(1) not in ELEMENT_BITS:
                return None
            layout = m.group(3)
            cached = cache[m.group(0)] = _array_from_match(cursor, m, layout.strip() if layout else None)
        cursor.pos = m.end()
        return cached
    if not text.startswith("(", pos):
        return None
    end = _tuple_end(cursor)
    key = text[pos:end]
    cached = cache.get(key)
    if cached is not None:
        cursor.pos = end
        return cached
    shape = _parse_tuple(cursor, cache)
    cache[key] = shape
    return shape


def parse_shape(cursor: Cursor, cache: dict[str, Shape], what: str = "a shape") -> Shape:
    start = cursor.skip_space()
    shape = parse_optional_shape(cursor, cache)
    if shape is None:
        m = _ARRAY.match(cursor.text, start)
        if m is not None:
            cursor.fail(f"unknown element type '{m.group(1)}'", start)
        cursor.fail(f"expected {what}, found {cursor.describe_next()}")
    return shape


def _array_from_match(cursor: Cursor, m: re.Match[str], layout: str | None) -> ArrayShape:
    body = m.group(2)
    if _PLAIN_DIMS.fullmatch(body) and len(body) < 19:
        plain = tuple(map(int, body.split(",")))
        if layout is not None:
            _check_layout(cursor, layout, len(plain), m.end(2) + 1)
        return ArrayShape(m.group(1), plain, (), layout)
    dims: list[int] = []
    dynamic: list[bool] = []
    if body.strip():
        offset = m.start(2)
        for piece in body.split(","):
            dm = _DIM.match(piece)
            if dm is None:
                cursor.fail(f"bad dimension '{piece.strip()}' in shape (expected N, <=N or ?)", offset)
            if int(dm.group(1) or dm.group(2) or 0) > _INT64_MAX:
                cursor.fail(f"dimension {piece.strip()} does not fit in int64", offset)
            if dm.group(1) is not None:
                dims.append(int(dm.group(1)))
                dynamic.append(False)
            elif dm.group(2) is not None:
                dims.append(int(dm.group(2)))
                dynamic.append(True)
            else:
                dims.append(-1)
                dynamic.append(True)
            offset += len(piece) + 1
    if layout is not None:
        _check_layout(cursor, layout, len(dims), m.end(2) + 1)
    return ArrayShape(m.group(1), tuple(dims), tuple(dynamic) if any(dynamic) else (), layout)


def _check_layout(cursor: Cursor, layout: str, rank: int, pos: int) -> None:
    """`{2,1,0}` (minor to major, then `:` and tiling): the dim list is a permutation of the dims."""
    plain = layout[0] == "{" and layout[-1] == "}" and _PLAIN_DIMS.fullmatch(layout, 1, len(layout) - 1)
    if plain and sorted(map(int, layout[1:-1].split(","))) == list(range(rank)):
        return
    order = layout.strip()[1:-1].split(":", 1)[0].strip()
    pieces = [p.strip() for p in order.split(",")] if order else []
    tail = layout.strip()[1:-1].partition(":")[2]
    if ":" in layout and not _LAYOUT_TAIL.fullmatch(tail):
        cursor.fail(f"layout {layout.strip()} has a part after ':' XLA does not read (T(..), E(n), S(n), ...)", pos)
    if not order and rank == 0:
        return
    if not all(p.isdigit() for p in pieces) or sorted(int(p) for p in pieces) != list(range(rank)):
        cursor.fail(f"layout {layout.strip()} is not an order of the {rank} dims of this shape", pos)


# Tuples nest a few levels in real modules (a While's state holding an optimizer's); shapes, shardings and
# buffers are walked recursively, so a bound keeps a nonsense nesting a located error, not a RecursionError.
MAX_TUPLE_NESTING = 64


def _tuple_end(cursor: Cursor) -> int:
    """End offset of the parenthesised tuple type at the cursor.

    Layout tiles such as `{1,0:T(8,128)}` hold balanced parentheses, so a
    plain depth count finds the closing one.
    """
    text, pos = cursor.text, cursor.pos
    close = text.find(")", pos)
    if close >= 0 and text.find("(", pos + 1, close) < 0:
        return close + 1
    depth = 0
    for m in _TUPLE_PARENS.finditer(text, pos):
        depth += 1 if m.group(0) == "(" else -1
        if depth > MAX_TUPLE_NESTING:
            cursor.fail(f"tuple shape nested more than {MAX_TUPLE_NESTING} deep", m.start())
        if depth == 0:
            return m.end()
    cursor.fail("unclosed '(' in tuple shape: input ends before its ')'")


def _parse_tuple(cursor: Cursor, cache: dict[str, Shape]) -> TupleShape:
    start = cursor.skip_space()
    cursor.expect("(")
    elements: list[Shape] = []
    if cursor.try_literal(")"):
        return TupleShape(())
    text = cursor.text
    while True:
        # Most elements are plain arrays read before: take them and their separator in one step.
        plain = _PLAIN_ELEMENT.match(text, cursor.pos)
        if plain is not None:
            shape = cache.get(plain.group(1))
            if shape is None:
                # Read where `parse_shape` would, after the space and comment before it.
                at = cursor.pos
                cursor.pos = plain.start(1)
                shape = parse_optional_shape(cursor, cache)
                if shape is None:
                    cursor.pos = at  # an unknown element type: `parse_shape` says so below
            if shape is not None:
                elements.append(shape)
                cursor.pos = plain.end()
                if plain.group(2) == ")":
                    return _validated(cursor, elements, start)
                continue
        elements.append(parse_shape(cursor, cache, "a tuple element shape"))
        if cursor.try_literal(")"):
            return _validated(cursor, elements, start)
        cursor.expect(",", "or ')' in tuple shape")


_INT64_MAX = (1 << 63) - 1


def _validated(cursor: Cursor, elements: list[Shape], start: int) -> TupleShape:
    """XLA validates the elements of a tuple shape (not a lone array): each one's bytes must fit in int64."""
    for e in elements:
        if isinstance(e, ArrayShape) and _overflows(e):
            cursor.fail(f"tuple element {e.to_text(False)} is too large: its bytes overflow int64", start)
    return TupleShape(tuple(elements))


def _overflows(shape: ArrayShape) -> bool:
    """ShapeUtil::ValidateShapeSize: the element count (`?` dims aside), then the bytes, within int64."""
    count = 1
    for d in shape.dims:
        count *= max(d, 1) if d < 0 else d
        if count > _INT64_MAX:
            return True
    return count * ((ELEMENT_BITS[shape.element_type] + 7) // 8) > _INT64_MAX

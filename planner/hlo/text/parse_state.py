"""What the pieces of the HLO parser share while reading one module.

The caches are per parse: real dumps repeat shapes (every get-tuple-element
of a While repeats its tuple type), attribute values and whole instruction
spellings, and each distinct one is read once.
"""

from __future__ import annotations

import bisect
import gc
from dataclasses import dataclass, field
from itertools import accumulate, repeat
from operator import add
from typing import Any

from planner.hlo.ir.module import Attribute, Computation, Instruction
from planner.hlo.ir.shapes import Shape
from planner.scanner import Cursor


def gc_paused() -> GcPause:
    """`with gc_paused():` pauses the cyclic garbage collector while a module is read.

    The IR holds no reference cycle, yet as it grows the collector would walk it again and again
    (a tenth of the time of reading a large dump) and free nothing. The collector is left as it
    was found, whatever the reading raises.
    """
    return GcPause()


class GcPause:
    """The context of `gc_paused` (a class, not a generator: leaving allocates nothing, so
    nothing sets the collector off on the way out)."""

    __slots__ = ("paused",)

    def __enter__(self) -> None:
        self.paused = gc.isenabled()
        if self.paused:
            gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.paused:
            gc.enable()


@dataclass(frozen=True, slots=True)
class PendingReference:
    """A called computation, checked once every computation is known."""

    caller: str
    callee: str
    pos: int


@dataclass
class Scope:
    """The instructions of the computation being read, by name.

    `elements` holds the get-tuple-element instructions made for `%t#k` operands
    (`planner.hlo.text.tuple_operands`) that the instruction being read brings in: they are
    placed before it.
    """

    name: str
    defined: dict[str, Instruction] = field(default_factory=dict)
    elements: list[Instruction] = field(default_factory=list)


class ParseState:
    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.cursor = Cursor(text, 0, source)
        self.shape_cache: dict[str, Shape] = {}
        self.attribute_cache: dict[tuple[str, str], Attribute] = {}
        # `, key=value, ...` text of a one-line instruction -> (attributes, (callee, offset in that text))
        self.attribute_list_cache: dict[str, tuple[tuple[Attribute, ...], tuple[tuple[str, int], ...]]] = {}
        # (shape text, opcode, attribute text) -> what `instruction_parser` reads from them, once
        self.spelling_cache: dict[tuple[str, str, str], Any] = {}
        # Operand lists with inline types -> (the operand names, their types or None where
        # untyped), once every type in them is read; and the last list looked up.
        self.typed_operands: dict[str, tuple[tuple[str, ...], tuple[Shape | None, ...]]] = {}
        self.last_typed_operands: tuple[str | None, tuple[tuple[str, ...], tuple[Shape | None, ...]] | None] = (
            None,
            None,
        )
        # Instruction checks that passed, by the identity of the (cached, shared) objects involved:
        # every object keyed here lives as long as the parse, so ids stay unique.
        self.checks_passed: set[tuple[Any, ...]] = set()
        self.references: list[PendingReference] = []
        # The computations read so far, by name (shape inference looks up called ones).
        self.computations: dict[str, Computation] = {}
        # Offset of the first character of each line; line i + 1 starts at line_starts[i].
        self.line_starts: list[int] = list(accumulate(map(add, map(len, text.split("\n")), repeat(1)), initial=0))
        self.line_starts.pop()
        # One entry per line, read by `instruction_parser` on first use.
        self.rows: list[tuple[str, ...]] | None = None

    def line_of(self, pos: int) -> int:
        return bisect.bisect_right(self.line_starts, pos)

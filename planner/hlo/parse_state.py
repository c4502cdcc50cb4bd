"""What the pieces of the HLO parser share while reading one module.

The caches are per parse: real dumps repeat shapes (every get-tuple-element
of a While repeats its tuple type), attribute values and whole instruction
spellings, and each distinct one is read once.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from planner.hlo.ir import Attribute, Instruction
from planner.hlo.scanner import Cursor
from planner.hlo.shapes import Shape

Spelling = tuple[Shape, tuple[Attribute, ...], tuple[tuple[str, int], ...]]


@dataclass(frozen=True, slots=True)
class PendingReference:
    """A called computation, checked once every computation is known."""

    caller: str
    callee: str
    pos: int


@dataclass
class Scope:
    """The instructions of the computation being read, by name."""

    name: str
    defined: dict[str, Instruction] = field(default_factory=dict)


class ParseState:
    def __init__(self, text: str, source: str) -> None:
        self.text = text
        self.cursor = Cursor(text, 0, source)
        self.shape_cache: dict[str, Shape] = {}
        self.attribute_cache: dict[tuple[str, str], Attribute] = {}
        # (shape text, opcode, attribute text) -> (shape, attributes, (callee, offset in attribute text))
        self.spelling_cache: dict[tuple[str, str, str], Spelling] = {}
        # Shape checks that passed, by the identity of the (cached, shared) shape and attribute
        # objects involved: every object keyed here lives as long as the parse, so ids stay unique.
        self.shapes_checked: set[tuple[int, ...]] = set()
        self.references: list[PendingReference] = []
        self._newlines = [m.start() for m in re.finditer("\n", text)]

    def line_of(self, pos: int) -> int:
        return bisect.bisect_right(self._newlines, pos - 1) + 1

"""A cursor over HLO text: whitespace and comments, literals, located errors.

Shared by `planner.hlo` and `planner.sharding`, and so a member of neither.

Every grammar piece (shapes, shardings, attributes, the module itself) reads
through a `Cursor`, so errors from any of them carry the same line, column and
caret. Scanning uses compiled regexes anchored at the cursor, which keeps the
per-token cost in C even on the 20 KB lines torch_xla prints.
"""

from __future__ import annotations

import re
from typing import NoReturn

from planner.errors import HloParseError

# HLO allows `/* ... */` anywhere whitespace is allowed (XLA prints
# `/*index=5*/` inside long tuples) and `//` line comments.
_SPACE = re.compile(r"(?:\s+|/\*.*?\*/|//[^\n]*)*", re.S)
# Characters that start neither whitespace nor a comment: at one of them there is nothing to skip.
_NOT_SPACE = frozenset(chr(c) for c in range(33, 127) if chr(c) != "/")
_NAME = re.compile(r"%?([A-Za-z_0-9][\w.\-]*)")
_INT = re.compile(r"-?\d+")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)


class Cursor:
    """A position in HLO text; `error()` turns a position into HloParseError."""

    __slots__ = ("pos", "source", "text")

    def __init__(self, text: str, pos: int = 0, source: str = "") -> None:
        self.text = text
        self.pos = pos
        self.source = source

    def skip_space(self) -> int:
        pos = self.pos
        if self.text[pos : pos + 1] not in _NOT_SPACE:
            self.pos = pos = _SPACE.match(self.text, pos).end()  # type: ignore[union-attr]
        return pos

    def peek(self) -> str:
        """The next significant character, or '' at end of text."""
        pos = self.skip_space()
        return self.text[pos : pos + 1]

    def at_end(self) -> bool:
        return self.peek() == ""

    def try_literal(self, literal: str) -> bool:
        pos = self.skip_space()
        if self.text.startswith(literal, pos):
            self.pos = pos + len(literal)
            return True
        return False

    def expect(self, literal: str, context: str = "") -> None:
        pos = self.skip_space()
        if self.text.startswith(literal, pos):
            self.pos = pos + len(literal)
        else:
            where = f" {context}" if context else ""
            self.fail(f"expected '{literal}'{where}, found {self.describe_next()}")

    def try_match(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        m = pattern.match(self.text, self.skip_space())
        if m is not None:
            self.pos = m.end()
        return m

    def match(self, pattern: re.Pattern[str], what: str) -> re.Match[str]:
        m = pattern.match(self.text, self.skip_space())
        if m is None:
            self.fail(f"expected {what}, found {self.describe_next()}")
        self.pos = m.end()
        return m

    def parse_name(self, what: str = "a name") -> str:
        m = _NAME.match(self.text, self.skip_space())
        if m is None:
            self.fail(f"expected {what}, found {self.describe_next()}")
        self.pos = m.end()
        return m.group(1)

    def parse_int(self, what: str = "an integer") -> int:
        m = _INT.match(self.text, self.skip_space())
        if m is None:
            self.fail(f"expected {what}, found {self.describe_next()}")
        self.pos = m.end()
        return int(m.group(0))

    def parse_string(self, what: str = "a quoted string") -> str:
        """Returns the string literal with its quotes, exactly as written."""
        return self.match(_STRING, what).group(0)

    def describe_next(self) -> str:
        self.skip_space()
        if self.pos >= len(self.text):
            return "end of input"
        token = re.match(r"[\w.%\-]+|\S", self.text[self.pos : self.pos + 40])
        return f"'{token.group(0) if token else self.text[self.pos]}'"

    def fail(self, message: str, pos: int | None = None) -> NoReturn:
        raise self.error(message, pos)

    def error(self, message: str, pos: int | None = None) -> HloParseError:
        return HloParseError.at(self.text, self.pos if pos is None else pos, message, self.source)


def next_token(text: str, pos: int) -> int:
    """Where the first character after `pos` that is not whitespace or a comment is."""
    return _SPACE.match(text, pos).end()  # type: ignore[union-attr]


def skip_balanced(cursor: Cursor, what: str) -> int:
    """Moves past one bracketed group starting at the cursor; returns its end.

    Tracks (), [] and {} and skips string literals, so values such as
    `metadata={op_name="a}b"}` or `backend_config={"x": [1, 2]}` are passed
    over in one go. The caller is at the opening bracket.
    """
    text = cursor.text
    start = cursor.pos
    closing = {"(": ")", "[": "]", "{": "}"}
    stack: list[str] = []
    pos = start
    for m in _BRACKETS.finditer(text, pos):
        token = m.group(0)
        if token[0] == '"':
            if m.group(1) is None:
                cursor.fail(f"unterminated string in {what}", m.start())
            continue
        if token in closing:
            stack.append(closing[token])
            continue
        if not stack or token != stack[-1]:
            expected = f"'{stack[-1]}'" if stack else "nothing"
            cursor.fail(f"unbalanced '{token}' in {what} (expected {expected})", m.start())
        stack.pop()
        if not stack:
            cursor.pos = m.end()
            return cursor.pos
    opener = text[start] if start < len(text) else "?"
    cursor.fail(f"unclosed '{opener}' in {what}: input ends before its '{closing.get(opener, '?')}'", start)


# A string literal (possibly unterminated at end of text) or one bracket.
_BRACKETS = re.compile(r'"(?:[^"\\]|\\.)*(")?|[()\[\]{}]', re.S)

"""The planner's error family.

Every failure a user can cause is one of these, carrying enough context to act
on: a parse error names the line and column and quotes the offending text.
`ValueError` is kept for bad arguments to value constructors; `assert` only
guards internal invariants.
"""

from __future__ import annotations

from typing import ClassVar, Literal

# Long HLO lines (torch_xla repeats whole tuple types on every operand) are
# clipped around the error column so the caret stays readable.
_CONTEXT_CHARS = 60


class PlannerError(Exception):
    """Base of every error the planner raises on purpose."""


class HloParseError(PlannerError):
    """HLO text that does not follow the grammar, located by line and column."""

    def __init__(self, message: str, line: int, column: int, line_text: str, source: str = "") -> None:
        self.message = message
        self.line = line
        self.column = column
        self.line_text = line_text
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        where = f"{self.source}:" if self.source else ""
        quoted, caret_at = _clip(self.line_text, self.column - 1)
        return f"{where}{self.line}:{self.column}: {self.message}\n  {quoted}\n  {' ' * caret_at}^"

    @classmethod
    def at(cls, text: str, pos: int, message: str, source: str = "") -> HloParseError:
        """Builds the error for absolute character offset `pos` of `text`."""
        pos = max(0, min(pos, len(text)))
        line_start = text.rfind("\n", 0, pos) + 1
        line_end = text.find("\n", pos)
        if line_end < 0:
            line_end = len(text)
        line = text.count("\n", 0, pos) + 1
        return cls(message, line, pos - line_start + 1, text[line_start:line_end], source)


def _clip(line_text: str, caret: int) -> tuple[str, int]:
    """Shortens a long line to a window around `caret`; returns (text, caret)."""
    if len(line_text) <= 2 * _CONTEXT_CHARS + 20:
        return line_text, caret
    start = max(0, caret - _CONTEXT_CHARS)
    end = min(len(line_text), caret + _CONTEXT_CHARS)
    prefix = "..." if start > 0 else ""
    suffix = "..." if end < len(line_text) else ""
    return prefix + line_text[start:end] + suffix, caret - start + len(prefix)


class UnsupportedHlo(PlannerError):
    """Valid HLO that uses a construct the planner does not model."""


class PlanningError(PlannerError):
    """The planner could not produce a plan for a well-formed request."""


# Why verify compiled nothing, by kind (`Unverifiable.cause`, `planner.plan.model.VerifyNotRun`).
VerifyCause = Literal["no-faithful-compile", "compiler-missing", "unreadable-module", "compile-failed"]


class Unverifiable(PlanningError):
    """No faithful compile of this module is possible here (the message says why): verify says so instead.

    `cause` names the kind for clients; each subclass sets its own.
    """

    cause: ClassVar[VerifyCause] = "no-faithful-compile"


class UnfaithfulConversion(Unverifiable):
    """The module has no StableHLO that jaxlib turns back into it, so jaxlib's compilers cannot compile it as given."""


class CompilerMissing(Unverifiable):
    """The compiler verify needs is not installed here; the message names the extra that brings it."""

    cause = "compiler-missing"


class CompileFailed(Unverifiable):
    """XLA ran on the module and failed or did not finish; the message is XLA's own error, in one line."""

    cause = "compile-failed"


class UnreadableModule(Unverifiable):
    """The installed jaxlib's HLO parser refuses the module's text, as it refuses forms a newer jax writes.

    `written_by` is that jax release when the text shows it (e.g. `jax 0.12`), `jaxlib` the installed one,
    `install` what to install to verify the module; the message says all three in one line.
    """

    cause = "unreadable-module"

    def __init__(self, message: str, written_by: str | None, jaxlib: str, install: str | None) -> None:
        super().__init__(message)
        self.written_by = written_by
        self.jaxlib = jaxlib
        self.install = install


class JaxlibRefusedText(PlannerError):
    """jaxlib's HLO parser refused text handed to it: XLA's reason, where, and the line it stopped on."""

    def __init__(self, reason: str, line: int, column: int, line_text: str) -> None:
        super().__init__(f"{line}:{column}: {reason}")
        self.reason = reason
        self.line = line
        self.column = column
        self.line_text = line_text


# What a recursion that ran out of stack reports: the parser bounds tuple nesting, so reaching this means
# another walk met a structure deeper than any real module's.
TOO_DEEP = "the module nests too deeply for the planner (a recursive walk ran out of stack)"


class PlanMismatch(ValueError):
    """A plan that does not fit the model or mesh it is applied to; the message names the mismatch."""

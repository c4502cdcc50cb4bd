"""An MLIR lit test file as text: its RUN lines as pass pipelines, and its `-split-input-file` chunks.

Shardy's lit tests run `sdy_opt %s -split-input-file -sdy-basic-propagate ... | FileCheck %s`. To run
them with jaxlib's own pass manager (which has no command line), a RUN line's flags become the textual
pipeline `builtin.module(sdy-basic-propagate,...)`, and the file is cut where `sdy_opt` cuts it: at
each `// -----` line, a chunk's lines keeping their place in the file (`first_line`) so that locations
read in a chunk name lines of the test file.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

SPLIT_MARKER = "// -----"
_RUN = re.compile(r"^\s*//\s*RUN:\s?(.*)$")

# sdy_opt's own flags: how to read and check the input, not passes.
_DRIVER_FLAGS = {"-split-input-file", "--split-input-file", "-verify-diagnostics", "--verify-diagnostics"}


@dataclass(frozen=True)
class RunLine:
    """One RUN line: `sdy_opt`'s passes in order, how it reads the file, and whether FileCheck reads it."""

    text: str
    passes: tuple[str, ...]  # `name` or `name{options}`, as a textual pipeline writes them
    split_input: bool
    verify_diagnostics: bool
    filecheck: bool

    def __post_init__(self) -> None:
        if not self.passes:
            raise ValueError(f"RUN line runs no pass: {self.text!r}")


@dataclass(frozen=True)
class Chunk:
    """A part of the file `sdy_opt -split-input-file` parses on its own; `first_line` is its 1-based line."""

    text: str
    first_line: int

    @property
    def line_offset(self) -> int:
        """What to add to a line number MLIR reports in the chunk to name the file's line."""
        return self.first_line - 1


def run_lines(text: str) -> list[RunLine]:
    """The file's RUN lines that invoke `sdy_opt` (a RUN line ending in `\\` continues on the next)."""
    commands: list[str] = []
    pending = ""
    for line in text.splitlines():
        m = _RUN.match(line)
        if m is None:
            continue
        body = m.group(1).rstrip()
        if body.endswith("\\"):
            pending += body[:-1] + " "
            continue
        commands.append(pending + body)
        pending = ""
    return [parse_run_line(c) for c in commands if c.split() and c.split()[0].endswith("sdy_opt")]


def parse_run_line(command: str) -> RunLine:
    """`sdy_opt %s -split-input-file -sdy-basic-propagate="a=1 b=2" 2>&1 | FileCheck %s` read as a RunLine."""
    tool, _, checker = command.partition("|")
    words = shlex.split(tool)
    passes = []
    for word in words[1:]:
        if word in {"%s", "2>&1"} or word in _DRIVER_FLAGS:
            continue
        if not word.startswith("-"):
            raise ValueError(f"unexpected word {word!r} in RUN line {command!r}")
        name, eq, options = word.lstrip("-").partition("=")
        passes.append(f"{name}{{{options}}}" if eq else name)
    return RunLine(
        text=command,
        passes=tuple(passes),
        split_input=any(w in words for w in ("-split-input-file", "--split-input-file")),
        verify_diagnostics=any(w in words for w in ("-verify-diagnostics", "--verify-diagnostics")),
        filecheck="FileCheck" in checker,
    )


def split_chunks(text: str, split_input: bool) -> list[Chunk]:
    """The file as `sdy_opt` parses it: whole, or cut at every `// -----` line (the marker in neither part)."""
    if not split_input:
        return [Chunk(text, 1)]
    chunks = []
    lines = text.splitlines(keepends=True)
    start = 0
    for index, line in enumerate(lines):
        if line.strip() == SPLIT_MARKER:
            chunks.append(Chunk("".join(lines[start:index]), start + 1))
            start = index + 1
    chunks.append(Chunk("".join(lines[start:]), start + 1))
    return chunks


def textual_pipeline(passes: tuple[str, ...], anchors: dict[str, str]) -> str:
    """The pass manager's textual pipeline for `passes`, each nested under its anchor op.

    `sdy_opt -a -b` nests a pass that runs on functions (`anchors[name] == "func.func"`) the way MLIR's
    command line does: adjacent function passes share one `func.func(...)`.
    """
    groups: list[tuple[str, list[str]]] = []
    for p in passes:
        anchor = anchors.get(p.split("{")[0], "builtin.module")
        if groups and groups[-1][0] == anchor:
            groups[-1][1].append(p)
        else:
            groups.append((anchor, [p]))
    parts = [",".join(ps) if anchor == "builtin.module" else f"{anchor}({','.join(ps)})" for anchor, ps in groups]
    return f"builtin.module({','.join(parts)})"

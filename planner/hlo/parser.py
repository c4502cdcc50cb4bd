"""HLO text -> `HloModule`.

Grammar (as XLA prints it):

    module       := 'HloModule' name (',' attribute)* debug_table* computation+
    debug_table  := ('FileNames'|'FunctionNames'|'FileLocations'|'StackFrames') (int value)*
    computation  := ['ENTRY'] name [signature] (',' attribute)* '{' instruction+ '}'
    signature    := '(' [name ':' shape (',' name ':' shape)*] ')' '->' shape

Instructions are read by `instruction_parser`, attributes by
`attribute_parser`. A reference to an undefined instruction or computation, a
duplicate name, a call cycle or a wrong operand count is reported at its
position, the way XLA's parser reports it.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

from planner.errors import HloParseError
from planner.hlo.attribute_parser import parse_attribute_list
from planner.hlo.instruction_parser import parse_body
from planner.hlo.ir import Computation, HloModule, Instruction
from planner.hlo.parse_state import ParseState, PendingReference, Scope
from planner.hlo.scanner import skip_balanced
from planner.hlo.shapes import Shape, parse_shape

_HEADER = re.compile(r"HloModule\b")
_ENTRY = re.compile(r"ENTRY\b")
_DEBUG_SECTION = re.compile(r"(FileNames|FunctionNames|FileLocations|StackFrames)\b")
_DEBUG_ID = re.compile(r"\d+(?=\s)")


def parse_hlo(text: str, source: str = "") -> HloModule:
    """Parses HLO module text; raises HloParseError with line and column."""
    if "\x00" in text:
        raise HloParseError.at(text, text.index("\x00"), "NUL byte in HLO text", source)
    return _parse_module(ParseState(text, source))


def parse_hlo_file(path: str | Path) -> HloModule:
    return parse_hlo(read_hlo_text(path), source=str(path))


def read_hlo_text(path: str | Path) -> str:
    """Reads a dump as text; gzip-compressed dumps are accepted too."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    try:
        return raw.decode()
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise HloParseError(f"file is not UTF-8 text ({e.reason} at byte {e.start})", line, 1, "", str(path)) from None


def _parse_module(state: ParseState) -> HloModule:
    c = state.cursor
    c.match(_HEADER, "'HloModule' at the start of the module")
    name = c.parse_name("the module name")
    attributes = parse_attribute_list(state)
    debug_tables = _parse_debug_tables(state)
    computations: list[Computation] = []
    positions: dict[str, int] = {}
    while not c.at_end():
        start = c.skip_space()
        comp = _parse_computation(state)
        if comp.name in positions:
            first_line = state.line_of(positions[comp.name])
            c.fail(f"computation '{comp.name}' is defined twice (first at line {first_line})", start)
        positions[comp.name] = start
        computations.append(comp)
    if not computations:
        c.fail("expected a computation: the module has none")
    entries = [comp for comp in computations if comp.is_entry]
    if len(entries) > 1:
        c.fail(f"more than one ENTRY computation: {', '.join(e.name for e in entries)}", positions[entries[1].name])
    # Without an ENTRY marker, XLA takes the last computation.
    entry = entries[0].name if entries else computations[-1].name
    _check_references(state, positions)
    return HloModule(name, tuple(computations), entry, attributes, debug_tables)


def _parse_debug_tables(state: ParseState) -> tuple[tuple[str, tuple[tuple[int, str], ...]], ...]:
    c = state.cursor
    tables = []
    while (m := c.try_match(_DEBUG_SECTION)) is not None:
        entries = []
        while (idm := c.try_match(_DEBUG_ID)) is not None:
            start = c.skip_space()
            if c.peek() == '"':
                c.parse_string()
            elif c.peek() == "{":
                skip_balanced(c, f"{m.group(1)} entry")
            else:
                c.fail(f"expected a quoted string or {{...}} in {m.group(1)}, found {c.describe_next()}")
            entries.append((int(idm.group(0)), state.text[start : c.pos]))
        tables.append((m.group(1), tuple(entries)))
    return tuple(tables)


def _parse_computation(state: ParseState) -> Computation:
    c = state.cursor
    start = c.skip_space()
    is_entry = c.try_match(_ENTRY) is not None
    name = c.parse_name("a computation name")
    signature: list[tuple[str, Shape]] = []
    if c.peek() == "(":
        signature = _parse_signature(state)
    extra = tuple((a.key, a.text) for a in parse_attribute_list(state))
    c.expect("{", f"to open the body of computation '{name}'")
    instructions, root = parse_body(state, Scope(name))
    if not instructions:
        c.fail(f"computation '{name}' has no instructions", start)
    _check_parameters(state, name, instructions, signature, start)
    return Computation(
        name=name,
        instructions=tuple(instructions),
        root_name=root if root is not None else instructions[-1].name,
        is_entry=is_entry,
        extra=extra,
        line=state.line_of(start),
    )


def _parse_signature(state: ParseState) -> list[tuple[str, Shape]]:
    c = state.cursor
    c.expect("(")
    params: list[tuple[str, Shape]] = []
    if not c.try_literal(")"):
        while True:
            pname = c.parse_name("a parameter name")
            c.expect(":", f"after parameter '{pname}'")
            params.append((pname, parse_shape(c, state.shape_cache, "a parameter shape")))
            if c.try_literal(")"):
                break
            c.expect(",", "or ')' in the parameter list")
    c.expect("->", "after the parameter list")
    parse_shape(c, state.shape_cache, "the result shape")
    return params


def _check_parameters(state: ParseState, name: str, instructions: list[Instruction],
                      signature: list[tuple[str, Shape]], start: int) -> None:  # fmt: skip
    numbers = sorted(i.parameter_number for i in instructions if i.parameter_number is not None)
    if numbers != list(range(len(numbers))):
        state.cursor.fail(f"parameters of computation '{name}' must be numbered 0..{len(numbers) - 1}, "
                          f"found {numbers}", start)  # fmt: skip
    if signature and len(signature) != len(numbers):
        state.cursor.fail(f"computation '{name}' declares {len(signature)} parameters in its signature "
                          f"but has {len(numbers)} parameter instructions", start)  # fmt: skip


def _check_references(state: ParseState, positions: dict[str, int]) -> None:
    """Every called computation exists, and no computation calls itself."""
    calls: dict[str, list[PendingReference]] = {}
    for ref in state.references:
        if ref.callee not in positions:
            state.cursor.fail(f"computation '{ref.callee}' is not defined", ref.pos)
        calls.setdefault(ref.caller, []).append(ref)
    # Iterative DFS: a While body that calls itself would send every later
    # walk over the call graph into a loop, so cycles are refused here.
    state_of: dict[str, int] = {}  # 1 on the current path, 2 done
    for root in positions:
        if state_of.get(root):
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path = [root]
        state_of[root] = 1
        while stack:
            comp, i = stack[-1]
            edges = calls.get(comp, [])
            if i == len(edges):
                stack.pop()
                path.pop()
                state_of[comp] = 2
                continue
            stack[-1] = (comp, i + 1)
            ref = edges[i]
            if state_of.get(ref.callee) == 1:
                cycle = [*path[path.index(ref.callee) :], ref.callee]
                state.cursor.fail(f"computations call each other in a cycle: {' -> '.join(cycle)}", ref.pos)
            if not state_of.get(ref.callee):
                state_of[ref.callee] = 1
                stack.append((ref.callee, 0))
                path.append(ref.callee)

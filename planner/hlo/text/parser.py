"""HLO text -> `HloModule`.

Grammar (as XLA prints it):

    module       := 'HloModule' name (',' attribute)* debug_table* computation+
    debug_table  := ('FileNames'|'FunctionNames'|'FileLocations'|'StackFrames') (int value)*
    computation  := ['ENTRY'] name [signature] '{' instruction+ '}'
    signature    := '(' [param (',' param)*] ')' '->' shape
    param        := name[':'] shape | '%'name shape

StableHLO text (`lowered.as_text()`) is converted to HLO first (`planner.hlo.text.stablehlo_text`).

Instructions are read by `instruction_parser`, attributes by
`attribute_parser`. A reference to an undefined instruction or computation (or
to one defined later: XLA's parser reads callees first), a duplicate name or a
wrong operand count is reported at its position, the way XLA's parser reports
it. What XLA's parser accepts, this one accepts, but for the verifier's checks
it makes too (tests/test_parse_differential.py lists them).
"""

from __future__ import annotations

import gzip
import re
import sys
import zlib
from pathlib import Path

from planner.errors import HloParseError
from planner.hlo.inference.shapes import compatible
from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.hlo.ir.shapes import Shape, parse_shape
from planner.hlo.ir.unique_names import repeated_names, uniquify_instruction_names
from planner.hlo.text.attribute_parser import parse_attribute_list
from planner.hlo.text.instruction_parser import parse_body
from planner.hlo.text.opcode_attributes import module_attribute_problem
from planner.hlo.text.parse_state import ParseState, Scope, gc_paused
from planner.hlo.text.stablehlo_text import is_stablehlo_text, read_stablehlo
from planner.scanner import skip_balanced

_HEADER = re.compile(r"HloModule\b")
_ENTRY = re.compile(r"ENTRY\b")
_DEBUG_SECTION = re.compile(r"(FileNames|FunctionNames|FileLocations|StackFrames)\b")
_DEBUG_ID = re.compile(r"\d+(?=\s)")
# `p: f32[]`, `p f32[]` or `%p f32[]`: XLA's lexer reads `p:` as one name token, so no space may come
# before the colon, and a `%` name takes none.
_SIGNATURE_NAME = re.compile(
    r"(?!(?:ROOT|ENTRY|HloModule|true|false)\b)(?:[A-Za-z_][\w.\-]*:?|%[\w.\-]+(?![\w.\-:]))", re.ASCII
)


def parse_hlo(text: str, source: str = "") -> HloModule:
    """Parses HLO module text, or StableHLO text by way of jaxlib; raises HloParseError with line and column."""
    if "\x00" in text:
        raise HloParseError.at(text, text.index("\x00"), "NUL byte in HLO text", source)
    if is_stablehlo_text(text):
        text = read_stablehlo(text, source)
    with gc_paused():
        return _parse_module(ParseState(text, source))


def parse_hlo_file(path: str | Path) -> HloModule:
    return parse_hlo(read_hlo_text(path), source=str(path))


def read_hlo_text(path: str | Path) -> str:
    """Reads a dump as text; gzip-compressed dumps are accepted too; `-` reads standard input."""
    raw = sys.stdin.buffer.read() if str(path) == "-" else Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except EOFError:
            raise HloParseError(
                "gzip file ends before its end-of-stream marker (cut short?)", 1, 1, "", str(path)
            ) from None
        except (OSError, zlib.error) as e:  # BadGzipFile is an OSError
            raise HloParseError(f"gzip file does not decompress: {e}", 1, 1, "", str(path)) from None
    try:
        return raw.decode()
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise HloParseError(f"file is not UTF-8 text ({e.reason} at byte {e.start})", line, 1, "", str(path)) from None


def _parse_module(state: ParseState) -> HloModule:
    c = state.cursor
    c.match(_HEADER, "'HloModule' at the start of the module")
    name = c.parse_name("the module name")
    header = c.pos
    attributes = parse_attribute_list(state)
    for a in attributes:
        problem = module_attribute_problem(a.key, a.text, state.shape_cache)
        if problem:
            at = state.text.find(f"{a.key}=", header)
            c.fail(problem[0], at + (len(a.key) + 1 + problem[1] if problem[1] else 0))
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
        state.computations[comp.name] = comp
        computations.append(comp)
    if not computations:
        c.fail("expected a computation: the module has none")
    entries = [comp for comp in computations if comp.is_entry]
    if len(entries) > 1:
        c.fail(f"more than one ENTRY computation: {', '.join(e.name for e in entries)}", positions[entries[1].name])
    # Without an ENTRY marker, XLA takes the last computation.
    entry = entries[0].name if entries else computations[-1].name
    _check_references(state, positions)
    if repeated_names(computations):
        computations = list(uniquify_instruction_names(computations))
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
    result: Shape | None = None
    if c.peek() == "(":
        result = _parse_signature(state)
    c.expect("{", f"to open the body of computation '{name}'")
    instructions, root = parse_body(state, Scope(name))
    if not instructions:
        c.fail(f"computation '{name}' has no instructions", start)
    # After the body XLA takes one attribute, `, execution_thread="host"` (computations run off the main thread).
    extra = []
    for attribute in parse_attribute_list(state):
        if attribute.key != "execution_thread":
            c.fail(f"unexpected attribute '{attribute.key}' after computation '{name}' (only execution_thread)",
                   c.text.rfind(attribute.key, 0, c.pos))  # fmt: skip
        extra.append((attribute.key, attribute.text))
    _check_parameters(state, name, instructions, start)
    root_inst = next(i for i in instructions if i.name == root) if root else instructions[-1]
    if result is not None and not compatible(result, root_inst.shape):
        c.fail(f"computation '{name}' returns {result.to_text(False)} by its signature but its root "
               f"'{root_inst.name}' is {root_inst.shape.to_text(False)}", start)  # fmt: skip
    return Computation(
        name=name,
        instructions=tuple(instructions),
        root_name=root_inst.name,
        is_entry=is_entry,
        extra=tuple(extra),
        line=state.line_of(start),
    )


def _parse_signature(state: ParseState) -> Shape:
    """`(name: shape, ...) -> shape`; returns the result shape.

    XLA reads the parameter shapes and ignores them (the parameter
    instructions decide), but the result must fit the root.
    """
    c = state.cursor
    c.expect("(")
    if not c.try_literal(")"):
        while True:
            c.match(_SIGNATURE_NAME, "a parameter name (as in p: f32[])")
            parse_shape(c, state.shape_cache, "a parameter shape")
            if c.try_literal(")"):
                break
            c.expect(",", "or ')' in the parameter list")
    c.expect("->", "after the parameter list")
    return parse_shape(c, state.shape_cache, "the result shape")


def _check_parameters(state: ParseState, name: str, instructions: list[Instruction], start: int) -> None:
    numbers = sorted(i.parameter_number for i in instructions if i.parameter_number is not None)
    if numbers != list(range(len(numbers))):
        state.cursor.fail(f"parameters of computation '{name}' must be numbered 0..{len(numbers) - 1}, "
                          f"found {numbers}", start)  # fmt: skip


def _check_references(state: ParseState, positions: dict[str, int]) -> None:
    """Every called computation is defined before its caller, as XLA's parser requires.

    XLA prints callees first and its parser resolves a name when it reads
    it, so a later (or the calling) computation "does not exist". That also
    rules out call cycles, such as a While body that calls back into its caller.
    """
    for ref in state.references:
        if ref.callee not in positions:
            state.cursor.fail(f"computation '{ref.callee}' is not defined", ref.pos)
        if positions[ref.callee] >= positions[ref.caller]:
            state.cursor.fail(f"computation '{ref.callee}' is not defined before its use in '{ref.caller}' "
                              "(XLA reads callees first)", ref.pos)  # fmt: skip

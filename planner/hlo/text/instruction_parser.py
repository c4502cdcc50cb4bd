"""Reading the instructions of one computation body.

    instruction := ['ROOT'] name '=' [shape] opcode '(' operands ')' (',' attribute)*
    operands    := [[shape] name (',' [shape] name)*]   -- parameter(N), constant(literal)

Real dumps print one instruction per line, in XLA's own spacing. One regex
pass over the whole text (`_ROWS`) splits it into lines and takes such lines
apart; what a line shares with others (shape, opcode and attribute text: its
spelling) is read once and cached, and so are the checks that depend only on
shared objects. Positions are worked out again only when a line fails or
names a computation.

Lines of two kinds are read from their rows:

- simple lines, `%name = f32[..]{..} op(%a, %b), key=flat-value, ...`, the
  spelling `_SIMPLE_LINE` describes. Their checks run in this order: the
  spelling (opcode, shape, attributes, sharding fit), then the operands.
- typed lines, the same with operand types (`op(f32[..] %a)`, as torch_xla
  prints them) or quoted attribute values. They follow the general path's
  order (shape, opcode, operands, attributes), so they are read from their
  row only when everything in them is known good: a spelling read before,
  operand types read before, defined operands. Anything else reads the line
  the general way.

Every other spelling (multi-line attributes, nested values, omitted shapes,
comments, several instructions on one line) takes the general path, a cursor
over the text. All paths make the same checks and report the same errors.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from types import MemberDescriptorType
from typing import NoReturn

from planner.errors import HloParseError
from planner.hlo.inference.shapes import compatible
from planner.hlo.ir.attributes import COMPUTATION_ATTRIBUTES
from planner.hlo.ir.module import Attribute, Instruction
from planner.hlo.ir.opcodes import ARITY, OPCODES, arity_problem
from planner.hlo.ir.shapes import Shape, parse_optional_shape, parse_shape
from planner.hlo.text.attribute_parser import (
    FLAT_VALUE,
    called_computations,
    parse_attribute_list,
    parse_attribute_value,
    read_whole_value,
)
from planner.hlo.text.instruction_checks import (
    fit_sharding,
    infer_shape,
    literal_problem,
    same_shape,
    tuple_index_problem,
    tuple_shape_problem,
)
from planner.hlo.text.opcode_attributes import attribute_problem
from planner.hlo.text.parse_state import ParseState, PendingReference, Scope, gc_paused
from planner.hlo.text.shape_checks import needs_shape_check, shape_problem, shapes_only_group
from planner.hlo.text.tuple_operands import element_problem, make_elements
from planner.scanner import next_token, skip_balanced

_NAME = r"%?[A-Za-z_0-9][\w.\-]*+"
# An operand names an instruction, or element k of a tuple-valued one: `%t#k`, `%t#i#j` (`tuple_operands`).
_ELEMENT = r"(?:\#\d++)*+"
_OPERAND = rf"(?:/\*index=\d++\*/)?{_NAME}{_ELEMENT}"
# One instruction on one line, from its name to the end of the line: groups are ROOT, name,
# shape, opcode, operands and the `, key=value` attributes. Each piece can be read only one
# way, so the possessive quantifiers change nothing but the speed.
_ONE_LINE = (
    r"(ROOT[ \t]+)?%?([A-Za-z_0-9][\w.\-]*+)[ \t]*=[ \t]*"
    r"([a-z][a-z0-9]*+\[[^\]\n]*+\](?:\{[^{}\n]*+\})?|\([^()\n]*+\))[ \t]+"
    rf"([a-z][a-z0-9\-]*+)\(([ \t]*(?:{_OPERAND}[ \t]*(?:,[ \t]*{_OPERAND}[ \t]*)*+,?[ \t]*)?)\)"
    rf"((?:,[ \t]*[A-Za-z_][\w\-]*+={FLAT_VALUE})*+)[ \t]*(?=\n|\Z)"
)
# A simple instruction after any whitespace, from a position in the text.
_SIMPLE_LINE = re.compile(rf"\s*{_ONE_LINE}")

# The rows: lines in XLA's own spacing, with ASCII names and plain layouts.
_ASCII_NAME = r"[A-Za-z_0-9][A-Za-z0-9_.\-]*+"
_ASCII_OPERAND = rf"(?:/\*index=\d++\*/)?%?{_ASCII_NAME}{_ELEMENT}"
_PLAIN_SHAPE = r"[a-z][a-z0-9]*+\[[0-9,]*+\](?:\{[0-9,]*+\})?|\([^()\n]*+\)"
_TYPED_OPERAND = rf"(?:/\*index=\d++\*/)?(?:(?:{_PLAIN_SHAPE}) )?%?{_ASCII_NAME}{_ELEMENT}"
_QUOTED = r'"(?:[^"\\\n]++|\\.)*+"'
_HEAD = rf"[ \t]*+(ROOT )?%?({_ASCII_NAME}) = ({_PLAIN_SHAPE}) ([a-z][a-z0-9\-]*+)\("
_SIMPLE_TAIL = (
    rf"((?:{_ASCII_OPERAND}(?:, {_ASCII_OPERAND})*+)?)\)((?:, [A-Za-z_][A-Za-z0-9_\-]*+={FLAT_VALUE})*+)(?=\n|\Z)"
)
_TYPED_TAIL = (
    rf"((?:{_TYPED_OPERAND}(?:, {_TYPED_OPERAND})*+)?)\)"
    rf"((?:, [A-Za-z_][A-Za-z0-9_\-]*+=(?:{FLAT_VALUE}|{_QUOTED}))*+)(?=\n|\Z)"
)
# Every line of the text in one pass; row i is line i + 1. A simple line in this spelling (a
# subset of `_SIMPLE_LINE`) fills groups 1-6; a typed line fills 1-4 and 7-8, and is never a
# simple line (it has an operand type or a quoted value); any other line fills none.
#
# Tuple types of operands run to thousands of characters (a While body's parameter, on each of
# its get-tuple-element lines); in rows they are scanned to the first ')' only, three times as
# fast. The operand list of a typed row is checked against `_TYPED_ARGS` before it is used, and
# a tuple type that ran over a line end shows as a missing row (`_read_rows`).
_LOOSE_TYPED_TAIL = _TYPED_TAIL.replace(r"\([^()\n]*+\)", r"\([^)]*+\)")
_ROWS = re.compile(rf"(?:{_HEAD}(?:{_SIMPLE_TAIL}|{_LOOSE_TYPED_TAIL})|[^\n]*+)\n?")
_STRICT_ROWS = re.compile(rf"(?:{_HEAD}(?:{_SIMPLE_TAIL}|{_TYPED_TAIL})|[^\n]*+)\n?")
# A typed line again, for positions: groups 1-4 as in a row, 5-6 its operands and attributes.
_TYPED_LINE = re.compile(_HEAD + _TYPED_TAIL)
_TYPED_ARGS = re.compile(rf"(?:{_TYPED_OPERAND}(?:, {_TYPED_OPERAND})*+)?")
_TYPED_OPERANDS = re.compile(rf"(?:/\*index=\d++\*/)?(?:({_PLAIN_SHAPE}) )?%?({_ASCII_NAME}{_ELEMENT})")
assert _LOOSE_TYPED_TAIL != _TYPED_TAIL

_FLAT_ATTRIBUTE = re.compile(rf",[ \t]*([A-Za-z_][\w\-]*)=({FLAT_VALUE})")
_FLAT_ATTRIBUTES = re.compile(rf"(?:, [A-Za-z_][A-Za-z0-9_\-]*+={FLAT_VALUE})*+")
_COMMENTS = re.compile(r"/\*.*?\*/")
_INDEX_COMMENT = re.compile(r"/\*index=\d++\*/")
_OPERAND_NAMES = re.compile(r"%?([A-Za-z_0-9][\w.\-]*(?:#\d+)*)")
_ROOT = re.compile(r"ROOT\b")
_ELEMENT_SUFFIX = re.compile(r"(?:#\d+)+")
_OPCODE = re.compile(r"([a-z][a-z0-9\-]*)\s*(?=\()")

# What the checks need to know of an opcode: operand count bounds (a count outside them is
# looked at by `arity_problem`; reduce's always is, for its pairs) and which check applies.
_NO_CHECK, _SHAPE_CHECK, _TUPLE_INDEX_CHECK, _TUPLE_CHECK = range(4)
_STRUCTURE_CHECKS = {"get-tuple-element": _TUPLE_INDEX_CHECK, "tuple": _TUPLE_CHECK}
_ANY_COUNT = (0, 1 << 62)
_COUNT_BOUNDS = {op: (-1, -1) if op == "reduce" else (low, high or 1 << 62) for op, (low, high) in ARITY.items()}

# The inline path skips the checks for these two: they take no operands and have none.
assert _COUNT_BOUNDS["parameter"][0] == _COUNT_BOUNDS["constant"][0] == 0


# What a spelling reads as: (shape, attributes, (callee, offset in the attribute text), min
# operands, max operands, check, check key). The check key stands for the spelling (or for its
# shape, when the check reads nothing else) in the keys of checks that passed.
Spelling = tuple[Shape, tuple[Attribute, ...], tuple[tuple[str, int], ...], int, int, int, int]


_MakeInstruction = Callable[
    [str, str, Shape, tuple[str, ...], tuple[Attribute, ...], int | None, str | None, int], Instruction
]


def _instruction_maker() -> _MakeInstruction:
    """`Instruction(...)` for the hot paths, at half the cost: a frozen slots dataclass's
    `__init__` sets each field through `object.__setattr__`; this sets the slots directly, which
    makes the same object. Anything else about `Instruction` (other fields, a `__post_init__`
    check) and it is the class itself."""
    names = tuple(f.name for f in dataclasses.fields(Instruction))
    expected = ("name", "opcode", "shape", "operands", "attributes", "parameter_number", "literal", "line")
    slots = [getattr(Instruction, n, None) for n in names]
    if (
        names != expected
        or hasattr(Instruction, "__post_init__")
        or not all(isinstance(s, MemberDescriptorType) for s in slots)
    ):
        return Instruction
    new = object.__new__
    setters = [s.__set__ for s in slots]  # type: ignore[union-attr]
    set_name, set_opcode, set_shape, set_operands, set_attributes, set_number, set_literal, set_line = setters

    def make(name: str, opcode: str, shape: Shape, operands: tuple[str, ...], attributes: tuple[Attribute, ...],
             number: int | None, literal: str | None, line: int) -> Instruction:  # fmt: skip
        inst = new(Instruction)
        set_name(inst, name)
        set_opcode(inst, opcode)
        set_shape(inst, shape)
        set_operands(inst, operands)
        set_attributes(inst, attributes)
        set_number(inst, number)
        set_literal(inst, literal)
        set_line(inst, line)
        return inst  # type: ignore[no-any-return]

    return make


_new_instruction = _instruction_maker()


def parse_body(state: ParseState, scope: Scope) -> tuple[list[Instruction], str | None]:
    """Reads instructions up to the closing '}'; returns them and the ROOT's name."""
    # `parse_hlo` reads the whole module with the collector paused; a body read on its own is too.
    with gc_paused():
        return _parse_body(state, scope)


def _parse_body(state: ParseState, scope: Scope) -> tuple[list[Instruction], str | None]:
    text = state.text
    c = state.cursor
    rows = state.rows if state.rows is not None else _read_rows(state)
    starts = state.line_starts
    num_lines = len(starts)
    defined = scope.defined
    spellings = state.spelling_cache
    checks_passed = state.checks_passed
    instructions: list[Instruction] = []
    append = instructions.append
    # Tuple elements read as `%t#k` by the instruction being read, to be placed before it.
    elements = scope.elements
    root: str | None = None
    # The line to read next, or -1 while the cursor is inside a line that goes on.
    i = _next_line(state, c.pos)
    while True:
        if 0 <= i < num_lines:
            is_root, name, shape_text, opcode, args, attrs, typed_args, typed_attrs = rows[i]
            i += 1
            if name and not typed_args and not typed_attrs:
                # A simple line in XLA's spelling: the common case, read inline. The other
                # paths below make the same checks in the same order.
                if name in defined:
                    _duplicate(state, scope, name, _position(state, _SIMPLE_LINE, starts[i - 1], 2))
                entry = spellings.get((shape_text, opcode, attrs))
                if entry is None:
                    entry = _read_spelling(state, shape_text, opcode, attrs, starts[i - 1], None, name)
                shape, attributes, callees, low, high, check, check_key = entry
                if callees:
                    # The row ends right after its attributes.
                    end = starts[i] - 1 if i < num_lines else len(text)
                    _add_references(state, scope, callees, end - len(attrs))
                if opcode == "parameter":
                    if not args.isdigit():
                        c.fail("expected a parameter number", _position(state, _SIMPLE_LINE, starts[i - 1], 5))
                    inst = _new_instruction(name, opcode, shape, (), attributes, int(args), None, i)
                elif opcode == "constant":
                    # Constants repeat (`constant(1)`): each literal is read once per spelling.
                    if (check_key, args) not in checks_passed:
                        problem = literal_problem(shape, args)
                        if problem:
                            c.fail(problem, _position(state, _SIMPLE_LINE, starts[i - 1], 5))
                        checks_passed.add((check_key, args))
                    inst = _new_instruction(name, opcode, shape, (), attributes, None, args, i)
                else:
                    if "#" in args:
                        _tuple_elements(state, scope, _OPERAND_NAMES.findall(args), i, starts[i - 1])
                    # Names in this spelling hold no '%', ',' or ' '.
                    if "," not in args and "/*" not in args and args:
                        source = defined.get(args[1:] if args[0] == "%" else args)
                        if source is None:
                            at = _position(state, _SIMPLE_LINE, starts[i - 1], 5)
                            _first_undefined(state, scope, name, (args.lstrip("%"),), at)
                        operands: tuple[str, ...] = (source.name,)
                        operand_shapes = [source.shape]
                        key: tuple[int, ...] = (check_key, id(source.shape))
                    else:
                        if "/*" in args:
                            # A row's comments are `/*index=N*/`, each before an operand.
                            operands = tuple(_INDEX_COMMENT.sub("", args).replace("%", "").split(", "))
                        elif args:
                            operands = tuple(args.replace("%", "").split(", "))
                        else:
                            operands = ()
                        try:
                            operand_shapes = [defined[o].shape for o in operands]
                        except KeyError:
                            at = _position(state, _SIMPLE_LINE, starts[i - 1], 5)
                            _first_undefined(state, scope, name, operands, at)
                        key = (check_key, *map(id, operand_shapes))
                    inst = _new_instruction(name, opcode, shape, operands, attributes, None, None, i)
                    count = len(operands)
                    if not low <= count <= high:
                        problem = arity_problem(opcode, count)
                        if problem:
                            c.fail(problem, _position(state, _SIMPLE_LINE, starts[i - 1], 4))
                    if check and key not in checks_passed:
                        problem, at_opcode = _check_problem(inst, operand_shapes, check)
                        if problem:
                            c.fail(problem, _position(state, _SIMPLE_LINE, starts[i - 1], 4 if at_opcode else 2))
                        checks_passed.add(key)
                if is_root:
                    if root is not None:
                        _second_root(state, scope, root, _position(state, _SIMPLE_LINE, starts[i - 1], 2))
                    root = name
                if elements:
                    instructions.extend(elements)
                    elements.clear()
                defined[name] = inst
                append(inst)
                continue
            if not name:
                other = text[starts[i - 1] : starts[i] - 1 if i < num_lines else len(text)]
                if not other or other.isspace():
                    continue  # a blank line
            general_at = starts[i - 1]
            typed_line = i if name else 0
            read = _read_line(state, scope, general_at, i, is_root, name, shape_text, opcode, typed_args, typed_attrs)
        elif i >= 0:
            general_at, typed_line, read = len(text), 0, None
        else:
            general_at, typed_line = c.pos, 0
            read = _read_line(state, scope, general_at, 0, "", "", "", "", "", "")
        if read is None:
            c.pos = general_at
            start = c.skip_space()
            if text.startswith("}", start):
                c.pos = start + 1
                return instructions, root
            if start >= len(text):
                c.fail(f"input ends inside computation '{scope.name}': expected '}}'")
            num_references = len(state.references)
            general_root, inst, start, opcode_pos = _parse_general(state, scope)
            is_root = "ROOT" if general_root else ""
            _check_general(state, scope, inst, start, opcode_pos)
            i = _next_line(state, c.pos)
            if typed_line and i == typed_line:
                # A typed line read whole: its spelling reads the same on every line.
                _learn_spelling(state, general_at, inst, shape_text, typed_attrs, num_references)
        else:
            read_root, inst, located, anchor, operand_shapes, entry, end = read
            is_root = read_root or ""
            if end >= 0:
                c.pos = end
                i = _next_line(state, end)
            _, _, _, low, high, check, check_key = entry
            count = len(inst.operands)
            if not low <= count <= high:
                problem = arity_problem(inst.opcode, count)
                if problem:
                    c.fail(problem, _position(state, located, anchor, 4))
            if check:
                key = (check_key, *map(id, operand_shapes))
                if key not in checks_passed:
                    problem, at_opcode = _check_problem(inst, operand_shapes, check)
                    if problem:
                        c.fail(problem, _position(state, located, anchor, 4 if at_opcode else 2))
                    checks_passed.add(key)
            if is_root and root is not None:
                start = _position(state, located, anchor, 2)
        if is_root:
            if root is not None:
                _second_root(state, scope, root, start)
            root = inst.name
        if elements:
            instructions.extend(elements)
            elements.clear()
        defined[inst.name] = inst
        append(inst)


def _read_line(
    state: ParseState, scope: Scope, anchor: int, line: int,
    is_root: str, name: str, shape_text: str, opcode: str, typed_args: str, typed_attrs: str,
) -> tuple[str | None, Instruction, re.Pattern[str], int, list[Shape], Spelling, int] | None:  # fmt: skip
    """A typed row (`name` given), or a simple instruction `_SIMPLE_LINE` finds at `anchor`;
    None when the line needs the general path.

    Returns (ROOT, the instruction, the regex that locates it at `anchor`, its operands'
    shapes, its spelling, where the cursor goes next or -1 for the next row); the checks after
    reading remain to be made.
    """
    if name:
        typed = _read_typed_line(state, scope, name, shape_text, opcode, typed_args, typed_attrs, line)
        if typed is None:
            return None
        return (is_root, typed[0], _TYPED_LINE, anchor, typed[2], typed[1], typed[3])
    text = state.text
    c = state.cursor
    m = _SIMPLE_LINE.match(text, anchor)
    if m is None:
        return None
    root, name, shape_text, opcode, args, attrs = m.groups()
    defined = scope.defined
    if name in defined:
        _duplicate(state, scope, name, m.start(2))
    entry: Spelling | None = state.spelling_cache.get((shape_text, opcode, attrs))
    if entry is None:
        entry = _read_spelling(state, shape_text, opcode, attrs, anchor, m, name)
    if entry[2]:
        _add_references(state, scope, entry[2], m.start(6))
    number = literal = None
    operands: tuple[str, ...] = ()
    operand_shapes: list[Shape] = []
    if opcode == "parameter":
        if not args.strip().isdigit():
            c.fail("expected a parameter number", m.start(5))
        number = int(args)
    elif opcode == "constant":
        literal = args.strip()
        problem = literal_problem(entry[0], literal)
        if problem:
            c.fail(problem, m.start(5))
    else:
        operands = tuple(_OPERAND_NAMES.findall(_COMMENTS.sub("", args) if "/*" in args else args))
        if "#" in args:
            _tuple_elements(state, scope, operands, line or state.line_of(m.start(2)), m.start(5))
        try:
            operand_shapes = [defined[o].shape for o in operands]
        except KeyError:
            _first_undefined(state, scope, name, operands, m.start(5))
    line = line or state.line_of(m.start(2))
    inst = Instruction(name, opcode, entry[0], operands, entry[1], number, literal, line)
    return root, inst, _SIMPLE_LINE, anchor, operand_shapes, entry, m.end()


def _read_rows(state: ParseState) -> list[tuple[str, ...]]:
    text = state.text
    rows = _ROWS.findall(text)
    # One row per line, and one more after a last line with no newline; fewer rows mean a row
    # ran over a line end.
    if len(rows) != len(state.line_starts) + (1 if text and not text.endswith("\n") else 0):
        rows = _STRICT_ROWS.findall(text)
    state.rows = rows
    return rows


def _next_line(state: ParseState, pos: int) -> int:
    """The line to read next from `pos` on: the line after it when the rest of its line is
    blank, its own line when `pos` is at the line's first token; else -1."""
    text = state.text
    end = text.find("\n", pos)
    if end < 0:
        if pos >= len(text) or text[pos:].isspace():
            return len(state.line_starts)
    elif end == pos or text[pos:end].isspace():
        return state.line_of(end)
    start = text.rfind("\n", 0, pos) + 1
    if start == pos or text[start:pos].isspace():
        return state.line_of(pos) - 1
    return -1


def _position(state: ParseState, located: re.Pattern[str], anchor: int, group: int) -> int:
    """Where group 2 (the name) or 4 (the opcode) of the line at `anchor` starts, as the path
    that reads such lines reports it: the general path names a typed line's name with its '%'."""
    m = located.match(state.text, anchor)
    assert m is not None, "a line read from its row reads again at its anchor"
    pos = m.start(group)
    if located is _TYPED_LINE and group == 2 and pos > 0 and state.text[pos - 1] == "%":
        pos -= 1
    return pos


def _add_references(state: ParseState, scope: Scope, callees: tuple[tuple[str, int], ...], base: int) -> None:
    for callee, offset in callees:
        state.references.append(PendingReference(scope.name, callee, base + offset))


def _read_spelling(
    state: ParseState, shape_text: str, opcode: str, attrs: str, anchor: int, m: re.Match[str] | None, name: str
) -> Spelling:
    """Reads the shape, opcode and attributes of a simple line (named `name`), once per spelling.

    `m` is the line's `_SIMPLE_LINE` match; without it, the line is a row in XLA's spelling,
    which ends right after its attributes.
    """
    c = state.cursor
    text = state.text
    if opcode not in OPCODES:
        c.fail(f"unknown opcode '{opcode}'", _position(state, _SIMPLE_LINE, anchor, 4))
    shape = state.shape_cache.get(shape_text)
    if shape is None:
        # In a row, the shape comes after the first ' = ' (names hold no space).
        c.pos = m.start(3) if m is not None else text.index(" = ", anchor) + 3
        shape = parse_shape(c, state.shape_cache, f"the shape of '{m.group(2) if m is not None else name}'")
    attributes: tuple[Attribute, ...] = ()
    callees: tuple[tuple[str, int], ...] = ()
    if attrs:
        read = state.attribute_list_cache.get(attrs)
        if read is None:
            if m is not None:
                start = m.start(6)
            else:
                end = text.find("\n", anchor)
                start = (end if end >= 0 else len(text)) - len(attrs)
            read = state.attribute_list_cache[attrs] = _read_flat_attributes(state, start, start + len(attrs))
        attributes, callees = read
        _fail_at_attribute(state, attribute_problem(opcode, attributes, attrs), anchor)
        attributes, problem = fit_sharding(attributes, shape)
        if problem:
            m = _SIMPLE_LINE.match(text, anchor)
            assert m is not None
            c.fail(f"sharding of '{m.group(2)}' does not fit its shape: {problem}", m.start(2))
    if not attrs:
        _fail_at_attribute(state, attribute_problem(opcode, (), attrs), anchor)
    return _new_spelling(state, (shape_text, opcode, attrs), shape, attributes, callees)


def _new_spelling(
    state: ParseState, key: tuple[str, str, str], shape: Shape, attributes: tuple[Attribute, ...],
    callees: tuple[tuple[str, int], ...],
) -> Spelling:  # fmt: skip
    low, high, check, group = _OPCODE_INFO[key[1]]
    # A check that reads shapes alone is shared by the spellings with this shape in its group
    # (group < 4, so the key is one per shape and group).
    check_key = -(id(shape) * 4 + group) if group else len(state.spelling_cache)
    entry = (shape, attributes, callees, low, high, check, check_key)
    state.spelling_cache[key] = entry
    return entry


def _learn_spelling(
    state: ParseState, anchor: int, inst: Instruction, shape_text: str, attrs: str, num_references: int
) -> None:
    """Keeps what the general path read from a typed line, for the lines spelt like it."""
    m = _TYPED_LINE.match(state.text, anchor)
    if m is None or m.group(3) != shape_text or m.group(4) != inst.opcode or m.group(6) != attrs:
        return
    callees = tuple((ref.callee, ref.pos - m.start(6)) for ref in state.references[num_references:])
    key = (shape_text, inst.opcode, attrs)
    if key not in state.spelling_cache:
        _new_spelling(state, key, inst.shape, inst.attributes, callees)


def _typed_spelling(state: ParseState, shape_text: str, opcode: str, attrs: str, anchor: int) -> Spelling | None:
    """The spelling of a typed line when its parts read without a problem, else None.

    A problem is left for the general path to report: it reads the parts in its own order.
    """
    shape = state.shape_cache.get(shape_text)
    if shape is None or opcode not in OPCODES:
        return None
    read = state.attribute_list_cache.get(attrs)
    if read is None:
        if _FLAT_ATTRIBUTES.fullmatch(attrs) is None:
            return None  # a quoted value: the general path reads it
        # The row ends right after its attributes.
        end = state.text.find("\n", anchor)
        start = (end if end >= 0 else len(state.text)) - len(attrs)
        try:
            read = _read_flat_attributes(state, start, start + len(attrs))
        except HloParseError:
            return None
        state.attribute_list_cache[attrs] = read
    if attribute_problem(opcode, read[0], attrs):
        return None  # the general path says what
    attributes, problem = fit_sharding(read[0], shape)
    if problem:
        return None
    return _new_spelling(state, (shape_text, opcode, attrs), shape, attributes, read[1])


def _read_typed_line(
    state: ParseState, scope: Scope, name: str, shape_text: str, opcode: str, args: str, attrs: str, line: int
) -> tuple[Instruction, Spelling, list[Shape], int] | None:
    """A typed line from its row when every part of it reads without a problem, else None.

    Its parts are looked at in the general path's order (name, shape, opcode, operands,
    attributes), so that when one needs that path, nothing after it has been read yet. Only
    the checks that come after the general path's reading remain to be made.
    """
    defined = scope.defined
    if name in defined or opcode == "parameter" or opcode == "constant":
        return None
    # Operand lists whose types were all read before; a list repeats (the get-tuple-element lines
    # of a While body all read its parameter, its whole tuple type written out, one after the
    # other: the last list is compared before any is hashed). Rows read tuple types loosely: a
    # list with one is checked here.
    last_args, read = state.last_typed_operands
    if args != last_args:
        read = state.typed_operands.get(args)
        if read is None:
            if "(" in args and _TYPED_ARGS.fullmatch(args) is None:
                return None
            shapes = state.shape_cache
            names: list[str] = []
            types: list[Shape | None] = []
            for type_text, operand in _TYPED_OPERANDS.findall(args):
                if type_text:
                    declared = shapes.get(type_text)
                    if declared is None:
                        return None
                    types.append(declared)
                else:
                    types.append(None)
                names.append(operand)
            read = state.typed_operands[args] = (tuple(names), tuple(types))
        state.last_typed_operands = (args, read)
    operands, declared_types = read  # type: ignore[misc]
    if "#" in args:
        _tuple_elements(state, scope, operands, line, state.line_starts[line - 1])
    try:
        operand_shapes = [defined[o].shape for o in operands]
    except KeyError:
        return None
    for declared, actual in zip(declared_types, operand_shapes):
        if declared is not None and declared is not actual and not compatible(declared, actual):
            return None  # the general path says which operand's type does not fit
    text = state.text
    starts = state.line_starts
    entry = state.spelling_cache.get((shape_text, opcode, attrs))
    if entry is None:
        entry = _typed_spelling(state, shape_text, opcode, attrs, starts[line - 1])
        if entry is None:
            return None
    # The general path reads on past the line when the next token is a comma, and leaves the
    # cursor at that token (after any comments: the next instruction is read from there). When
    # the next line is an instruction's row, that token is its first: -1 says read that row.
    rows = state.rows
    if line < len(starts) and rows is not None and rows[line][1]:
        end = -1
    else:
        end = next_token(text, starts[line] - 1 if line < len(starts) else len(text))
        if text.startswith(",", end):
            return None
    shape, attributes, callees, *_ = entry
    if callees:
        _add_references(state, scope, callees, _TYPED_LINE.match(text, starts[line - 1]).start(6))  # type: ignore[union-attr]
    inst = _new_instruction(name, opcode, shape, operands, attributes, None, None, line)
    return inst, entry, operand_shapes, end


def _read_flat_attributes(
    state: ParseState, start: int, end: int
) -> tuple[tuple[Attribute, ...], tuple[tuple[str, int], ...]]:
    """`, key=value` pairs the line regex already delimited; each distinct pair is read once."""
    # Most lists are pairs read before or read whole, with no key twice and no computation:
    # those need no positions.
    pairs = _FLAT_ATTRIBUTE.findall(state.text, start, end)
    cache = state.attribute_cache
    attributes: list[Attribute] = []
    for pair in pairs:
        attribute = cache.get(pair)
        if attribute is None:
            attribute = read_whole_value(*pair)
            if attribute is None:
                break
            cache[pair] = attribute
        if attribute.key in COMPUTATION_ATTRIBUTES:
            break
        attributes.append(attribute)
    else:
        if len(pairs) < 2 or len({key for key, _ in pairs}) == len(pairs):
            return tuple(attributes), ()
    attributes = []
    keys: list[str] = []
    callees: list[tuple[str, int]] = []
    for m in _FLAT_ATTRIBUTE.finditer(state.text, start, end):
        key, value = m.groups()
        attribute = cache.get((key, value))
        if attribute is None:
            attribute = read_whole_value(key, value)
            if attribute is None:
                state.cursor.pos = m.start(2)
                attribute = parse_attribute_value(state, key)
            cache[(key, value)] = attribute
        if key in keys:
            state.cursor.fail(f"attribute '{key}' is given twice", m.start(1))
        if key in COMPUTATION_ATTRIBUTES:
            callees.extend((callee, m.start(1) - start) for callee in called_computations(attribute))
        keys.append(key)
        attributes.append(attribute)
    return tuple(attributes), tuple(callees)


def _check_kind(opcode: str) -> int:
    if needs_shape_check(opcode):
        return _SHAPE_CHECK
    return _STRUCTURE_CHECKS.get(opcode, _NO_CHECK)


assert _check_kind("parameter") == _check_kind("constant") == _NO_CHECK

# Per opcode: (min operands, max operands, check, `shapes_only_group`).
_OPCODE_INFO = {op: (*_COUNT_BOUNDS.get(op, _ANY_COUNT), _check_kind(op), shapes_only_group(op)) for op in OPCODES}


def _check_problem(inst: Instruction, operand_shapes: list[Shape], check: int) -> tuple[str | None, bool]:
    """What is wrong with `inst` given its operands' shapes, and whether to point at its opcode."""
    if check == _SHAPE_CHECK:
        problem = shape_problem(inst, operand_shapes)
        return (f"'{inst.name}': {problem}" if problem else None), True
    if check == _TUPLE_INDEX_CHECK:
        source, index = operand_shapes[0], inst.attr("index")
        problem = tuple_index_problem(index, source, inst.operands[0])
        if not problem:
            element = source.elements[index]  # type: ignore[union-attr]
            if not same_shape(element, inst.shape):
                problem = (f"get-tuple-element is declared {inst.shape.to_text(False)} but element "
                           f"{index} of '{inst.operands[0]}' is {element.to_text(False)}")  # fmt: skip
        return problem, False
    if check == _TUPLE_CHECK:
        return tuple_shape_problem(inst.shape, operand_shapes), False
    return None, False


def _check_general(state: ParseState, scope: Scope, inst: Instruction, start: int, opcode_pos: int) -> None:
    """The checks of a simple line, for an instruction read by the general path."""
    low, high = _COUNT_BOUNDS.get(inst.opcode, _ANY_COUNT)
    if not low <= len(inst.operands) <= high:
        problem = arity_problem(inst.opcode, len(inst.operands))
        if problem:
            state.cursor.fail(problem, opcode_pos)
    check = _check_kind(inst.opcode)
    if check:
        problem, at_opcode = _check_problem(inst, [scope.defined[o].shape for o in inst.operands], check)
        if problem:
            state.cursor.fail(problem, opcode_pos if at_opcode else start)


def _parse_general(state: ParseState, scope: Scope) -> tuple[bool, Instruction, int, int]:
    """Any spelling: returns (is_root, instruction, name position, opcode position)."""
    c = state.cursor
    is_root = c.try_match(_ROOT) is not None
    name_pos = c.skip_space()
    name = c.parse_name("an instruction name")
    if name in scope.defined:
        _duplicate(state, scope, name, name_pos)
    c.expect("=", f"after instruction name '{name}'")
    # XLA lets the shape be left out where it can be inferred.
    shape = parse_optional_shape(c, state.shape_cache)
    opcode_pos = c.skip_space()
    if shape is None and _OPCODE.match(state.text, opcode_pos) is None:
        parse_shape(c, state.shape_cache, f"the shape of '{name}'")
    opcode = c.match(_OPCODE, "an opcode followed by '('").group(1)
    if opcode not in OPCODES:
        c.fail(f"unknown opcode '{opcode}'", opcode_pos)
    c.expect("(")
    operands: tuple[str, ...] = ()
    number = literal = None
    if opcode == "parameter":
        number = c.parse_int("a parameter number")
        c.expect(")", "after the parameter number")
    elif opcode == "constant":
        c.pos -= 1
        literal_start = c.pos
        skip_balanced(c, "constant literal")
        literal = state.text[literal_start + 1 : c.pos - 1].strip()
    else:
        operands = _parse_operands(state, scope, name)
    attributes = parse_attribute_list(state, caller=scope.name)
    _fail_at_attribute(state, attribute_problem(opcode, attributes), opcode_pos)
    if shape is None:
        shape = infer_shape(state, opcode, [scope.defined[o].shape for o in operands], attributes, opcode_pos)
    if literal is not None:
        problem = literal_problem(shape, literal)
        if problem:
            c.fail(problem, literal_start + 1)
    attributes, problem = fit_sharding(attributes, shape)
    if problem:
        c.fail(f"sharding of '{name}' does not fit its shape: {problem}", name_pos)
    inst = Instruction(name, opcode, shape, operands, attributes, number, literal, state.line_of(name_pos))
    return is_root, inst, name_pos, opcode_pos


def _parse_operands(state: ParseState, scope: Scope, user: str) -> tuple[str, ...]:
    c = state.cursor
    if c.try_literal(")"):
        return ()
    operands = []
    while True:
        # torch_xla prints each operand's full type before its name; the type
        # must fit the operand's own shape (layouts aside), as XLA checks, and is dropped.
        declared = parse_optional_shape(c, state.shape_cache)
        pos = c.skip_space()
        operand = c.parse_name("an operand name")
        element = c.try_match(_ELEMENT_SUFFIX)
        if element is not None:
            operand += element.group(0)
            _tuple_elements(state, scope, (operand,), state.line_of(pos), pos)
        if operand not in scope.defined:
            _undefined(state, scope, user, operand, pos)
        actual = scope.defined[operand].shape
        if declared is not None and declared is not actual and not compatible(declared, actual):
            c.fail(f"operand '{operand}' is declared {declared.to_text(False)} but is {actual.to_text(False)}", pos)
        operands.append(operand)
        if c.try_literal(")"):
            return tuple(operands)
        c.expect(",", "or ')' after an operand")


def _tuple_elements(state: ParseState, scope: Scope, operands: Iterable[str], line: int, search_from: int) -> None:
    """Makes the get-tuple-element instructions of the `%t#k` operands not yet defined (`tuple_operands`)."""
    defined = scope.defined
    operands = tuple(operands)
    scope.elements.extend(make_elements(operands, defined, line))
    for operand in operands:
        if "#" in operand and operand not in defined:
            problem = element_problem(operand, defined)
            if problem:
                found = state.text.find(f"%{operand}", search_from)
                if found < 0:
                    found = state.text.find(operand, search_from)
                state.cursor.fail(problem, found if found >= 0 else search_from)


def _fail_at_attribute(state: ParseState, problem: tuple[str, str | None] | None, search_from: int) -> None:
    """Fails with an attribute problem (`opcode_attributes`) at the attribute it names, else at the opcode."""
    if problem:
        message, key = problem
        found = state.text.find(f"{key}=", search_from) if key else _OPCODE.search(state.text, search_from)
        pos = found if isinstance(found, int) else found.start() if found else -1
        state.cursor.fail(message, pos if pos >= 0 else search_from)


def _duplicate(state: ParseState, scope: Scope, name: str, pos: int) -> NoReturn:
    state.cursor.fail(f"instruction '{name}' is defined twice in computation '{scope.name}' "
                      f"(first at line {scope.defined[name].line})", pos)  # fmt: skip


def _second_root(state: ParseState, scope: Scope, root: str, pos: int) -> NoReturn:
    state.cursor.fail(f"computation '{scope.name}' has a second ROOT (the first is '{root}' at line "
                      f"{scope.defined[root].line})", pos)  # fmt: skip


def _first_undefined(
    state: ParseState, scope: Scope, user: str, operands: tuple[str, ...], search_from: int
) -> NoReturn:
    operand = next(o for o in operands if o not in scope.defined)
    _undefined(state, scope, user, operand, search_from)


def _undefined(state: ParseState, scope: Scope, user: str, operand: str, search_from: int) -> NoReturn:
    found = re.compile(rf"%?{re.escape(operand)}(?![\w.\-])").search(state.text, search_from)
    state.cursor.fail(f"operand '{operand}' of '{user}' is not defined earlier in computation '{scope.name}'",
                      found.start() if found else search_from)  # fmt: skip

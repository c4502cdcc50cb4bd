"""Reading the instructions of one computation body.

    instruction := ['ROOT'] name '=' [shape] opcode '(' operands ')' (',' attribute)*
    operands    := [[shape] name (',' [shape] name)*]   -- parameter(N), constant(literal)

Most lines of real dumps are spelt one way: `%name = f32[..]{..} op(%a, %b),
key=flat-value, ...` on one line. Such a line is matched whole by one regex,
and what it shares with other lines (shape, opcode and attribute text) is read
once and cached; every other spelling (inline operand types, multi-line
attributes, nested values, omitted shapes) takes the general path. Both paths
make the same checks.
"""

from __future__ import annotations

import re
from typing import NoReturn

from planner.hlo.attribute_parser import FLAT_VALUE, called_computations, parse_attribute_list, parse_attribute_value
from planner.hlo.instruction_checks import (
    fit_sharding,
    infer_shape,
    same_shape,
    tuple_index_problem,
    tuple_shape_problem,
)
from planner.hlo.ir import Attribute, Instruction
from planner.hlo.opcodes import ARITY, OPCODES, arity_problem
from planner.hlo.parse_state import ParseState, PendingReference, Scope
from planner.hlo.scanner import skip_balanced
from planner.hlo.shape_checks import needs_shape_check, shape_problem
from planner.hlo.shapes import Shape, parse_optional_shape, parse_shape

_NAME = r"%?[A-Za-z_0-9][\w.\-]*"
_INDEX_COMMENT = r"(?:/\*index=\d+\*/)?"
_SIMPLE_LINE = re.compile(
    rf"\s*(ROOT[ \t]+)?%?([A-Za-z_0-9][\w.\-]*)[ \t]*=[ \t]*"
    r"([a-z][a-z0-9]*\[[^\]\n]*\](?:\{[^{}\n]*\})?|\([^()\n]*\))[ \t]+"
    rf"([a-z][a-z0-9\-]*)\(((?:[ \t]*{_INDEX_COMMENT}{_NAME}[ \t]*,)*[ \t]*(?:{_INDEX_COMMENT}{_NAME})?[ \t]*)\)"
    rf"((?:,[ \t]*[A-Za-z_][\w\-]*={FLAT_VALUE})*)[ \t]*(?=\n|$)"
)
_FLAT_ATTRIBUTE = re.compile(rf",[ \t]*([A-Za-z_][\w\-]*)=({FLAT_VALUE})")
_COMMENTS = re.compile(r"/\*.*?\*/")
_OPERAND_NAMES = re.compile(r"%?([A-Za-z_0-9][\w.\-]*)")
_ROOT = re.compile(r"ROOT\b")
_OPCODE = re.compile(r"([a-z][a-z0-9\-]*)\s*(?=\()")


def parse_body(state: ParseState, scope: Scope) -> tuple[list[Instruction], str | None]:
    """Reads instructions up to the closing '}'; returns them and the ROOT's name."""
    text = state.text
    c = state.cursor
    defined = scope.defined
    spellings = state.spelling_cache
    line_of = state.line_of
    operand_names = _OPERAND_NAMES.findall
    instructions: list[Instruction] = []
    root: str | None = None
    pos = c.pos
    while True:
        m = _SIMPLE_LINE.match(text, pos)
        if m is not None:
            is_root, name, shape_text, opcode, args, attrs = m.groups()
            if name in defined:
                _duplicate(state, scope, name, m.start(2))
            entry = spellings.get((shape_text, opcode, attrs))
            if entry is None:
                entry = _read_spelling(state, m)
            shape, attributes, callees = entry
            for callee, offset in callees:
                state.references.append(PendingReference(scope.name, callee, m.start(6) + offset))
            operands: tuple[str, ...] = ()
            number = literal = None
            if opcode == "parameter":
                if not args.strip().isdigit():
                    c.fail("expected a parameter number", m.start(5))
                number = int(args)
            elif opcode == "constant":
                literal = args.strip()
            else:
                if "/*" in args:
                    args = _COMMENTS.sub("", args)
                operands = tuple(operand_names(args))
                for operand in operands:
                    if operand not in defined:
                        _undefined(state, scope, name, operand, m.start(5))
            inst = Instruction(name, opcode, shape, operands, attributes, number, literal, line_of(m.start(2)))
            opcode_pos, start = m.start(4), m.start(2)
            pos = m.end()
        else:
            start = c.pos = pos
            start = c.skip_space()
            if text.startswith("}", start):
                c.pos = start + 1
                return instructions, root
            if start >= len(text):
                c.fail(f"input ends inside computation '{scope.name}': expected '}}'")
            is_root, inst, start, opcode_pos = _parse_general(state, scope)
            pos = c.pos
        bounds = ARITY.get(inst.opcode)
        if bounds is not None and (
            not bounds[0] <= len(inst.operands) <= (bounds[1] or 1 << 30) or inst.opcode == "reduce"
        ):
            problem = arity_problem(inst.opcode, len(inst.operands))
            if problem:
                c.fail(problem, opcode_pos)
        if needs_shape_check(inst.opcode):
            operand_shapes = [defined[o].shape for o in inst.operands]
            key = (id(inst.attributes), id(inst.shape), *map(id, operand_shapes))
            if key not in state.shapes_checked:
                problem = shape_problem(inst, operand_shapes)
                if problem:
                    c.fail(f"'{inst.name}': {problem}", opcode_pos)
                state.shapes_checked.add(key)
        if inst.opcode == "get-tuple-element":
            source = defined[inst.operands[0]].shape
            problem = tuple_index_problem(inst.attr("index"), source, inst.operands[0])
            if not problem:
                element = source.elements[inst.attr("index")]  # type: ignore[union-attr]
                if not same_shape(element, inst.shape):
                    problem = (f"get-tuple-element is declared {inst.shape.to_text(False)} but element "
                               f"{inst.attr('index')} of '{inst.operands[0]}' is {element.to_text(False)}")  # fmt: skip
            if problem:
                c.fail(problem, start)
        elif inst.opcode == "tuple":
            problem = tuple_shape_problem(inst.shape, [defined[o].shape for o in inst.operands])
            if problem:
                c.fail(problem, start)
        if is_root:
            if root is not None:
                c.fail(f"computation '{scope.name}' has a second ROOT (the first is '{root}' at line "
                       f"{defined[root].line})", start)  # fmt: skip
            root = inst.name
        defined[inst.name] = inst
        instructions.append(inst)


def _read_spelling(
    state: ParseState, m: re.Match[str]
) -> tuple[Shape, tuple[Attribute, ...], tuple[tuple[str, int], ...]]:
    """Reads the shape, opcode and attributes of a simple line, once per spelling."""
    c = state.cursor
    shape_text, opcode, attrs = m.group(3), m.group(4), m.group(6)
    if opcode not in OPCODES:
        c.fail(f"unknown opcode '{opcode}'", m.start(4))
    shape = state.shape_cache.get(shape_text)
    if shape is None:
        c.pos = m.start(3)
        shape = parse_shape(c, state.shape_cache, f"the shape of '{m.group(2)}'")
    attributes: tuple[Attribute, ...] = ()
    callees: list[tuple[str, int]] = []
    if attrs:
        attributes, callees = _read_flat_attributes(state, m.start(6), m.end(6))
        attributes, problem = fit_sharding(attributes, shape)
        if problem:
            c.fail(f"sharding of '{m.group(2)}' does not fit its shape: {problem}", m.start(2))
    entry = (shape, attributes, tuple(callees))
    state.spelling_cache[(shape_text, opcode, attrs)] = entry
    return entry


def _read_flat_attributes(
    state: ParseState, start: int, end: int
) -> tuple[tuple[Attribute, ...], list[tuple[str, int]]]:
    """`, key=value` pairs the line regex already delimited; each distinct pair is read once."""
    attributes: list[Attribute] = []
    callees: list[tuple[str, int]] = []
    cache = state.attribute_cache
    for m in _FLAT_ATTRIBUTE.finditer(state.text, start, end):
        key = m.group(1)
        attribute = cache.get((key, m.group(2)))
        if attribute is None:
            state.cursor.pos = m.start(2)
            attribute = cache[(key, m.group(2))] = parse_attribute_value(state, key)
        if any(a.key == key for a in attributes):
            state.cursor.fail(f"attribute '{key}' is given twice", m.start(1))
        callees.extend((callee, m.start(1) - start) for callee in called_computations(attribute))
        attributes.append(attribute)
    return tuple(attributes), callees


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
    if shape is None:
        shape = infer_shape(opcode, [scope.defined[o].shape for o in operands], attributes)
        if shape is None:
            c.fail(f"cannot infer the shape of this {opcode}; write its shape before the opcode", opcode_pos)
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
        # repeats the operand's own shape, so it is read and dropped.
        parse_optional_shape(c, state.shape_cache)
        pos = c.skip_space()
        operand = c.parse_name("an operand name")
        if operand not in scope.defined:
            _undefined(state, scope, user, operand, pos)
        operands.append(operand)
        if c.try_literal(")"):
            return tuple(operands)
        c.expect(",", "or ')' after an operand")


def _duplicate(state: ParseState, scope: Scope, name: str, pos: int) -> NoReturn:
    state.cursor.fail(f"instruction '{name}' is defined twice in computation '{scope.name}' "
                      f"(first at line {scope.defined[name].line})", pos)  # fmt: skip


def _undefined(state: ParseState, scope: Scope, user: str, operand: str, search_from: int) -> NoReturn:
    found = re.compile(rf"%?{re.escape(operand)}(?![\w.\-])").search(state.text, search_from)
    state.cursor.fail(f"operand '{operand}' of '{user}' is not defined earlier in computation '{scope.name}'",
                      found.start() if found else search_from)  # fmt: skip

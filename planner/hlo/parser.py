"""HLO text -> `HloModule`.

Grammar (as XLA prints it):

    module       := 'HloModule' name (',' attribute)* debug_table* computation+
    debug_table  := ('FileNames'|'FunctionNames'|'FileLocations'|'StackFrames') (int value)*
    computation  := ['ENTRY'] name [signature] (',' attribute)* '{' instruction+ '}'
    signature    := '(' [name ':' shape (',' name ':' shape)*] ')' '->' shape
    instruction  := ['ROOT'] name '=' shape opcode '(' operands ')' (',' attribute)*
    operands     := [[shape] name (',' [shape] name)*]   -- parameter(N), constant(literal)
    attribute    := key '=' value

Every value is first delimited as raw text (bracket groups, strings and plain
runs with no space between them); keys with a reader in `attributes.READERS`
are then typed. A reference to an undefined instruction or computation, a
duplicate name, a call cycle or a wrong operand count is reported at its
position, the way XLA's parser reports it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from planner.errors import HloParseError
from planner.hlo.attributes import COMPUTATION_ATTRIBUTES, READERS, ComputationRefs, Raw
from planner.hlo.ir import Attribute, Computation, HloModule, Instruction
from planner.hlo.opcodes import BINARY_ELEMENTWISE, OPCODES, UNARY_ELEMENTWISE, arity_problem
from planner.hlo.scanner import Cursor, skip_balanced
from planner.hlo.shapes import ArrayShape, Shape, TupleShape, parse_optional_shape, parse_shape
from planner.sharding.hlo_sharding import HloSharding

_HEADER = re.compile(r"HloModule\b")
_ENTRY = re.compile(r"ENTRY\b")
_ROOT = re.compile(r"ROOT\b")
_OPCODE = re.compile(r"([a-z][a-z0-9\-]*)\s*(?=\()")
_ATTR_KEY = re.compile(r"([A-Za-z_][\w\-]*)\s*=")
_RAW_RUN = re.compile(r'[^\s,{}()\[\]"]+')
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_DEBUG_SECTIONS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_DEBUG_SECTION = re.compile(r"(" + "|".join(_DEBUG_SECTIONS) + r")\b")
_DEBUG_ID = re.compile(r"\d+(?=\s)")
# Fast paths for the common spellings; anything else takes the general path.
_NAME = r"%?[A-Za-z_0-9][\w.\-]*"
# A plain run, or braces with no nested braces (quoted strings allowed inside).
_FLAT_VALUE = r"(?:[^\s,{}()\[\]\"]+|\{(?:[^{}\"\n]|\"(?:[^\"\\\n]|\\.)*\")*\})"
_FLAT_ATTRIBUTE = re.compile(rf",[ \t]*([A-Za-z_][\w\-]*)=({_FLAT_VALUE})")
_SIMPLE_INSTRUCTION = re.compile(
    rf"(ROOT[ \t]+)?%?([A-Za-z_0-9][\w.\-]*)[ \t]*=[ \t]*"
    r"([a-z][a-z0-9]*\[[^\]\n]*\](?:\{[^{}\n]*\})?)[ \t]+"
    rf"([a-z][a-z0-9\-]*)\(((?:[ \t]*{_NAME}[ \t]*,)*[ \t]*(?:{_NAME})?[ \t]*)\)"
    rf"((?:,[ \t]*[A-Za-z_][\w\-]*={_FLAT_VALUE})*)[ \t]*(?=\n|$)"
)
_FAST_OPERANDS = re.compile(r"\s*((?:%?[A-Za-z_0-9][\w.\-]*\s*,\s*)*%?[A-Za-z_0-9][\w.\-]*)?\s*\)")
_FAST_ATTRIBUTE = re.compile(r"\s*,\s*([A-Za-z_][\w\-]*)=([^\s,{}()\[\]\"]+|\{[^{}\"\n]*\})(?=[\s,]|$)")
# A value ends at a separator; anything else right after a typed value is junk.
_VALUE_END = re.compile(r"\s|,|/\*|//|\}|$")


def parse_hlo(text: str, source: str = "") -> HloModule:
    """Parses HLO module text; raises HloParseError with line and column."""
    return _ModuleParser(text, source).parse_module()


def parse_hlo_file(path: str | Path) -> HloModule:
    path = Path(path)
    try:
        text = path.read_text()
    except UnicodeDecodeError as e:
        raise HloParseError(f"file is not UTF-8 text ({e.reason} at byte {e.start})", 1, 1, "", str(path)) from None
    return parse_hlo(text, source=str(path))


@dataclass
class _PendingReference:
    """A called computation, checked once every computation is known."""

    caller: str
    callee: str
    pos: int


@dataclass
class _ComputationScope:
    name: str
    defined: dict[str, Instruction] = field(default_factory=dict)


class _ModuleParser:
    def __init__(self, text: str, source: str) -> None:
        if "\x00" in text:
            raise HloParseError.at(text, text.index("\x00"), "NUL byte in HLO text", source)
        self.text = text
        self.cursor = Cursor(text, 0, source)
        self.shape_cache: dict[str, Shape] = {}
        self.references: list[_PendingReference] = []
        self.attribute_cache: dict[tuple[str, str], Attribute] = {}
        self._line_pos = 0
        self._line_no = 1

    # -- module -------------------------------------------------------------

    def parse_module(self) -> HloModule:
        c = self.cursor
        c.match(_HEADER, "'HloModule' at the start of the module")
        name = c.parse_name("the module name")
        attributes = self._parse_attribute_list()
        debug_tables = self._parse_debug_tables()
        computations: list[Computation] = []
        positions: dict[str, int] = {}
        while not c.at_end():
            start = c.skip_space()
            comp = self._parse_computation()
            if comp.name in positions:
                first_line = self._line_of(positions[comp.name])
                c.fail(f"computation '{comp.name}' is defined twice (first at line {first_line})", start)
            positions[comp.name] = start
            computations.append(comp)
        if not computations:
            c.fail("expected a computation: the module has none")
        entries = [comp for comp in computations if comp.is_entry]
        if len(entries) > 1:
            c.fail(f"more than one ENTRY computation: {', '.join(e.name for e in entries)}",
                   positions[entries[1].name])  # fmt: skip
        entry = entries[0].name if entries else computations[-1].name
        self._check_references(positions)
        return HloModule(name, tuple(computations), entry, attributes, debug_tables)

    def _parse_debug_tables(self) -> tuple[tuple[str, tuple[tuple[int, str], ...]], ...]:
        c = self.cursor
        tables = []
        while (m := c.try_match(_DEBUG_SECTION)) is not None:
            entries = []
            while (idm := c.try_match(_DEBUG_ID)) is not None:
                c.skip_space()
                start = c.pos
                if c.peek() == '"':
                    c.parse_string()
                elif c.peek() == "{":
                    skip_balanced(c, f"{m.group(1)} entry")
                else:
                    c.fail(f"expected a quoted string or {{...}} in {m.group(1)}, found {c.describe_next()}")
                entries.append((int(idm.group(0)), self.text[start : c.pos]))
            tables.append((m.group(1), tuple(entries)))
        return tuple(tables)

    def _check_references(self, positions: dict[str, int]) -> None:
        calls: dict[str, list[_PendingReference]] = {}
        for ref in self.references:
            if ref.callee not in positions:
                self.cursor.fail(f"computation '{ref.callee}' is not defined", ref.pos)
            calls.setdefault(ref.caller, []).append(ref)
        # Iterative DFS for cycles: a While body that calls itself would send
        # every later walk over the call graph into a loop.
        state: dict[str, int] = {}
        for root in positions:
            if state.get(root):
                continue
            stack: list[tuple[str, int]] = [(root, 0)]
            path: list[str] = [root]
            state[root] = 1
            while stack:
                comp, i = stack[-1]
                edges = calls.get(comp, [])
                if i == len(edges):
                    stack.pop()
                    path.pop()
                    state[comp] = 2
                    continue
                stack[-1] = (comp, i + 1)
                ref = edges[i]
                if state.get(ref.callee) == 1:
                    cycle = path[path.index(ref.callee) :] + [ref.callee]
                    self.cursor.fail(f"computations call each other in a cycle: {' -> '.join(cycle)}", ref.pos)
                if not state.get(ref.callee):
                    state[ref.callee] = 1
                    stack.append((ref.callee, 0))
                    path.append(ref.callee)

    # -- computation --------------------------------------------------------

    def _parse_computation(self) -> Computation:
        c = self.cursor
        start = c.skip_space()
        is_entry = c.try_match(_ENTRY) is not None
        name = c.parse_name("a computation name")
        signature: list[tuple[str, Shape, int]] = []
        if c.peek() == "(":
            signature = self._parse_signature()
        extra = tuple((a.key, a.text) for a in self._parse_attribute_list())
        c.expect("{", f"to open the body of computation '{name}'")
        scope = _ComputationScope(name)
        instructions: list[Instruction] = []
        root: str | None = None
        root_pos = 0
        text = self.text
        while True:
            inst_start = c.skip_space()
            if text.startswith("}", inst_start):
                c.pos += 1
                break
            if inst_start >= len(text):
                c.fail(f"input ends inside computation '{name}': expected '}}'")
            inst, is_root = self._parse_instruction(scope)
            if is_root:
                if root is not None:
                    c.fail(f"computation '{name}' has a second ROOT (the first is '{root}' at line "
                           f"{self._line_of(root_pos)})", inst_start)  # fmt: skip
                root, root_pos = inst.name, inst_start
            instructions.append(inst)
        if not instructions:
            c.fail(f"computation '{name}' has no instructions", start)
        self._check_parameters(name, instructions, signature, start)
        return Computation(
            name=name,
            instructions=tuple(instructions),
            root_name=root if root is not None else instructions[-1].name,
            is_entry=is_entry,
            extra=extra,
            line=self._line_of(start),
        )

    def _parse_signature(self) -> list[tuple[str, Shape, int]]:
        c = self.cursor
        c.expect("(")
        params: list[tuple[str, Shape, int]] = []
        if not c.try_literal(")"):
            while True:
                pos = c.skip_space()
                pname = c.parse_name("a parameter name")
                c.expect(":", f"after parameter '{pname}'")
                params.append((pname, parse_shape(c, self.shape_cache, "a parameter shape"), pos))
                if c.try_literal(")"):
                    break
                c.expect(",", "or ')' in the parameter list")
        c.expect("->", "after the parameter list")
        parse_shape(c, self.shape_cache, "the result shape")
        return params

    def _check_parameters(self, name: str, instructions: list[Instruction],
                          signature: list[tuple[str, Shape, int]], start: int) -> None:  # fmt: skip
        numbers = sorted(i.parameter_number for i in instructions if i.parameter_number is not None)
        if numbers != list(range(len(numbers))):
            self.cursor.fail(f"parameters of computation '{name}' must be numbered 0..{len(numbers) - 1}, "
                             f"found {numbers}", start)  # fmt: skip
        if signature and len(signature) != len(numbers):
            self.cursor.fail(f"computation '{name}' declares {len(signature)} parameters in its signature "
                             f"but has {len(numbers)} parameter instructions", start)  # fmt: skip

    # -- instruction --------------------------------------------------------

    def _parse_instruction(self, scope: _ComputationScope) -> tuple[Instruction, bool]:
        c = self.cursor
        start = c.pos
        line = _SIMPLE_INSTRUCTION.match(self.text, start)
        if line is not None:
            return self._parse_simple_instruction(scope, line)
        is_root = c.try_match(_ROOT) is not None
        name_pos = c.skip_space()
        name = c.parse_name("an instruction name")
        c.expect("=", f"after instruction name '{name}'")
        # XLA lets the shape be left out where it can be inferred.
        shape = parse_optional_shape(c, self.shape_cache)
        opcode_pos = c.skip_space()
        if shape is None and _OPCODE.match(self.text, opcode_pos) is None:
            parse_shape(c, self.shape_cache, f"the shape of '{name}'")
        opcode = c.match(_OPCODE, "an opcode followed by '('").group(1)
        c.expect("(")
        self._check_new_instruction(scope, name, name_pos, opcode, opcode_pos)
        operands: tuple[str, ...] = ()
        parameter_number = None
        literal = None
        if opcode == "parameter":
            parameter_number = c.parse_int("a parameter number")
            c.expect(")", "after the parameter number")
        elif opcode == "constant":
            c.pos -= 1
            literal_start = c.pos
            skip_balanced(c, "constant literal")
            literal = self.text[literal_start + 1 : c.pos - 1].strip()
        else:
            operands = self._parse_operands(scope, name)
        attributes = self._parse_attribute_list(caller=scope.name)
        if shape is None:
            shape = _infer_shape(c, opcode, [scope.defined[o].shape for o in operands], attributes, opcode_pos)
        attributes = self._fit_sharding(attributes, shape, name, start)
        inst = Instruction(name, opcode, shape, operands, attributes, parameter_number, literal, self._line_of(start))
        self._finish_instruction(scope, inst, opcode_pos, start)
        return inst, is_root

    def _parse_simple_instruction(self, scope: _ComputationScope, line: re.Match[str]) -> tuple[Instruction, bool]:
        """One line in the usual spelling, matched whole by one regex.

        `[ROOT] %name = f32[..]{..} opcode(%a, %b), key=flat, ...` covers most
        instructions of real dumps; its pieces still pass every check the
        general path makes.
        """
        c = self.cursor
        name, opcode = line.group(2), line.group(4)
        opcode_pos = line.start(4)
        self._check_new_instruction(scope, name, line.start(2), opcode, opcode_pos)
        shape = self.shape_cache.get(line.group(3))
        if shape is None:
            c.pos = line.start(3)
            shape = parse_shape(c, self.shape_cache, f"the shape of '{name}'")
        args = line.group(5).strip()
        operands: tuple[str, ...] = ()
        parameter_number = None
        literal = None
        if opcode == "parameter":
            if not args.isdigit():
                c.fail("expected a parameter number", line.start(5))
            parameter_number = int(args)
        elif opcode == "constant":
            literal = args
        elif args:
            operands = tuple(a.strip().lstrip("%") for a in args.split(","))
            for operand in operands:
                if operand not in scope.defined:
                    self._undefined_operand(scope, name, operand, line.start(5))
        attributes: tuple[Attribute, ...] = ()
        if line.group(6):
            attributes = self._fit_sharding(self._flat_attributes(line, scope.name), shape, name, line.start())
        c.pos = line.end()
        inst = Instruction(name, opcode, shape, operands, attributes, parameter_number, literal,
                           self._line_of(line.start()))  # fmt: skip
        self._finish_instruction(scope, inst, opcode_pos, line.start())
        return inst, line.group(1) is not None

    def _flat_attributes(self, line: re.Match[str], caller: str) -> tuple[Attribute, ...]:
        """Attributes of a simple line; each distinct `key=value` is read once."""
        attributes: list[Attribute] = []
        cache = self.attribute_cache
        for m in _FLAT_ATTRIBUTE.finditer(self.text, line.start(6), line.end(6)):
            key = m.group(1)
            attribute = cache.get((key, m.group(2)))
            if attribute is None:
                self.cursor.pos = m.start(2)
                attribute = cache[(key, m.group(2))] = self._parse_attribute_value(key)
            if any(a.key == key for a in attributes):
                self.cursor.fail(f"attribute '{key}' is given twice", m.start(1))
            if key in COMPUTATION_ATTRIBUTES and isinstance(attribute.value, ComputationRefs):
                for callee in attribute.value.names:
                    self.references.append(_PendingReference(caller, callee, m.start(1)))
            attributes.append(attribute)
        return tuple(attributes)

    def _fit_sharding(self, attributes: tuple[Attribute, ...], shape: Shape, name: str,
                      pos: int) -> tuple[Attribute, ...]:  # fmt: skip
        """Checks a sharding against the shape and expands it over tuples.

        As in XLA's parser, one non-tuple sharding on a tuple-shaped
        instruction stands for every leaf (`{replicated}` on a 3-tuple is
        three `{replicated}`); a tiled sharding must tile exactly the array's
        rank, and a tuple sharding needs one entry per leaf.
        """
        for i, attribute in enumerate(attributes):
            if attribute.key != "sharding":
                continue
            sharding = attribute.value
            problem = sharding_shape_problem(sharding, shape)
            if problem:
                self.cursor.fail(f"sharding of '{name}' does not fit its shape: {problem}", pos)
            if isinstance(shape, TupleShape) and not sharding.is_tuple:
                count = max(len(shape.leaves()), 1)
                expanded = Attribute("sharding", HloSharding.tuple_of((sharding,) * count), attribute.text)
                return attributes[:i] + (expanded,) + attributes[i + 1 :]
        return attributes

    def _check_new_instruction(self, scope: _ComputationScope, name: str, name_pos: int, opcode: str,
                               opcode_pos: int) -> None:  # fmt: skip
        if name in scope.defined:
            self.cursor.fail(f"instruction '{name}' is defined twice in computation '{scope.name}' "
                             f"(first at line {scope.defined[name].line})", name_pos)  # fmt: skip
        if opcode not in OPCODES:
            self.cursor.fail(f"unknown opcode '{opcode}'", opcode_pos)

    def _finish_instruction(self, scope: _ComputationScope, inst: Instruction, opcode_pos: int, start: int) -> None:
        problem = arity_problem(inst.opcode, len(inst.operands))
        if problem:
            self.cursor.fail(problem, opcode_pos)
        if inst.opcode == "get-tuple-element":
            self._check_tuple_index(scope, inst, start)
        scope.defined[inst.name] = inst

    def _undefined_operand(self, scope: _ComputationScope, user: str, operand: str, search_from: int) -> None:
        pos = self.text.find(operand, search_from)
        self.cursor.fail(f"operand '{operand}' of '{user}' is not defined earlier in computation '{scope.name}'",
                         pos if pos >= 0 else search_from)  # fmt: skip

    def _parse_operands(self, scope: _ComputationScope, user: str) -> tuple[str, ...]:
        c = self.cursor
        fast = _FAST_OPERANDS.match(self.text, c.pos)
        if fast is not None:
            # Operands by name only: `%a, %b)`.
            names = tuple(n.strip().lstrip("%") for n in fast.group(1).split(",")) if fast.group(1) else ()
            for operand in names:
                if operand not in scope.defined:
                    self._undefined_operand(scope, user, operand, c.pos)
            c.pos = fast.end()
            return names
        if c.try_literal(")"):
            return ()
        operands = []
        while True:
            # torch_xla prints each operand's full type before its name; the
            # type repeats the operand's own shape, so it is read and dropped.
            parse_optional_shape(c, self.shape_cache)
            pos = c.skip_space()
            operand = c.parse_name("an operand name")
            if operand not in scope.defined:
                self._undefined_operand(scope, user, operand, pos)
            operands.append(operand)
            if c.try_literal(")"):
                return tuple(operands)
            c.expect(",", "or ')' after an operand")

    def _check_tuple_index(self, scope: _ComputationScope, inst: Instruction, start: int) -> None:
        source = scope.defined[inst.operands[0]].shape
        index = inst.attr("index")
        if index is None:
            self.cursor.fail(f"get-tuple-element '{inst.name}' needs index=N", start)
        if not isinstance(source, TupleShape) or not 0 <= index < len(source.elements):
            arity = len(source.elements) if isinstance(source, TupleShape) else "no"
            self.cursor.fail(f"get-tuple-element index {index} is out of range: '{inst.operands[0]}' has "
                             f"{arity} tuple elements", start)  # fmt: skip

    # -- attributes ---------------------------------------------------------

    def _parse_attribute_list(self, caller: str | None = None) -> tuple[Attribute, ...]:
        c = self.cursor
        text = self.text
        attributes: list[Attribute] = []
        seen: set[str] = set()
        while True:
            fast = _FAST_ATTRIBUTE.match(text, c.pos)
            if fast is not None:
                # A flat value (`index=3`, `dimensions={0,1}`, `sharding={...}`)
                # repeats across instructions; each distinct one is read once.
                key, key_pos = fast.group(1), fast.start(1)
                attribute = self.attribute_cache.get((key, fast.group(2)))
                if attribute is None:
                    c.pos = fast.start(2)
                    attribute = self._parse_attribute_value(key)
                    self.attribute_cache[(key, fast.group(2))] = attribute
                c.pos = fast.end()
            elif c.try_literal(","):
                key_pos = c.skip_space()
                key = c.match(_ATTR_KEY, "an attribute like key=value").group(1)
                attribute = self._parse_attribute_value(key)
            else:
                return tuple(attributes)
            if key in seen:
                c.fail(f"attribute '{key}' is given twice", key_pos)
            seen.add(key)
            if caller is not None and key in COMPUTATION_ATTRIBUTES and isinstance(attribute.value, ComputationRefs):
                for callee in attribute.value.names:
                    self.references.append(_PendingReference(caller, callee, key_pos))
            attributes.append(attribute)

    def _parse_attribute_value(self, key: str) -> Attribute:
        c = self.cursor
        start = c.skip_space()
        reader = READERS.get(key)
        if reader is None:
            end = self._scan_raw_value(key)
            return Attribute(key, Raw(self.text[start:end]), self.text[start:end])
        try:
            value = reader(c)
        except ValueError as e:
            c.fail(f"bad value for {key}: {e}", start)
        if _VALUE_END.match(self.text, c.pos) is None:
            c.fail(f"unexpected {c.describe_next()} after the value of '{key}'")
        return Attribute(key, value, self.text[start : c.pos])

    def _scan_raw_value(self, key: str) -> int:
        """Delimits a value we do not model: atoms with no space between them."""
        c = self.cursor
        text = self.text
        start = c.pos
        while c.pos < len(text):
            ch = text[c.pos]
            if ch in "([{":
                skip_balanced(c, f"the value of '{key}'")
            elif ch == '"':
                string = _STRING.match(text, c.pos)
                if string is None:
                    c.fail(f"unterminated string in the value of '{key}'")
                c.pos = string.end()
            else:
                m = _RAW_RUN.match(text, c.pos)
                if m is None:
                    break
                c.pos = m.end()
        if c.pos == start:
            c.fail(f"expected a value for '{key}', found {c.describe_next()}")
        return c.pos

    def _line_of(self, pos: int) -> int:
        # Positions arrive mostly in increasing order; count incrementally.
        if pos >= self._line_pos:
            self._line_no += self.text.count("\n", self._line_pos, pos)
        else:
            self._line_no = self.text.count("\n", 0, pos) + 1
        self._line_pos = pos
        return self._line_no


def _infer_shape(cursor: Cursor, opcode: str, operand_shapes: list[Shape], attributes: tuple[Attribute, ...],
                 pos: int) -> Shape:  # fmt: skip
    """The shape of an instruction written without one, where XLA infers it."""
    if opcode == "tuple":
        return TupleShape(tuple(operand_shapes))
    if opcode in UNARY_ELEMENTWISE - {"convert", "bitcast-convert", "real", "imag", "is-finite"} or (
        opcode in BINARY_ELEMENTWISE - {"compare", "complex"}
    ):
        first = operand_shapes[0]
        if isinstance(first, ArrayShape):
            return first
    if opcode == "compare" and isinstance(operand_shapes[0], ArrayShape):
        return ArrayShape("pred", operand_shapes[0].dims, operand_shapes[0].dynamic)
    if opcode == "get-tuple-element":
        index = next((a.value for a in attributes if a.key == "index"), None)
        source = operand_shapes[0]
        if isinstance(source, TupleShape) and isinstance(index, int) and 0 <= index < len(source.elements):
            return source.elements[index]
    cursor.fail(f"cannot infer the shape of this {opcode}; write its shape before the opcode", pos)


def sharding_shape_problem(sharding: HloSharding, shape: Shape) -> str | None:
    """Why `sharding` cannot apply to `shape`, or None when it can.

    A tuple sharding on an array-shaped instruction is left alone: ops such as
    outfeed carry the sharding of their operand tuple.
    """
    if sharding.is_tuple:
        if not isinstance(shape, TupleShape):
            return None
        leaves = shape.leaves()
        if len(sharding.elements) != max(len(leaves), 1):
            return f"{len(sharding.elements)} tuple entries for {len(leaves)} leaf arrays"
        return next(filter(None, (sharding_shape_problem(e, leaf) for e, leaf in zip(sharding.elements, leaves))), None)
    if isinstance(shape, TupleShape):
        if sharding.is_tiled:
            return f"a tiled sharding cannot apply to the tuple {shape.to_text()}"
        return None
    if sharding.is_tiled and sharding.tiled_data_rank != shape.rank:
        return f"{sharding.tiled_data_rank} tiled dims but {shape.to_text()} has rank {shape.rank}"
    return None

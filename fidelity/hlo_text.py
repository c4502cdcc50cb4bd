"""What a record keeps of an HLO module's text: instruction names, opcodes, operands, callees, shardings.

The runners record XLA's decisions as XLA printed them (`HloSharding::ToString`, already canonical),
so they read the dumps with this small reader rather than the planner's parser: a reference must not
change when the code it checks changes. It reads both forms XLA prints: the dumps' long form
(`%name`, operands without types) and `as_text()`'s short form (`name`, operands possibly typed).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*")
# `[ENTRY] %name (params) -> shape {` in the long form; `[ENTRY] name {` in the short form.
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([^\s(]+)\s.*\{\s*$")
_CALLEE_KEYS = ("to_apply", "calls", "condition", "body", "true_computation", "false_computation",
                "branch_computations")  # fmt: skip
_OPEN, _CLOSE = "([{", ")]}"
_COMMENT = re.compile(r"/\*.*?\*/")


@dataclass(frozen=True)
class TextInstruction:
    name: str
    opcode: str
    operands: tuple[str, ...]
    callees: tuple[str, ...]  # called computations, in the order their attributes print
    sharding: str | None  # the `sharding=` attribute verbatim
    parameter_number: int | None = None


@dataclass(frozen=True)
class TextComputation:
    name: str
    instructions: dict[str, TextInstruction]
    root: str
    is_entry: bool


def _close(text: str, start: int) -> int:
    """The index of the bracket closing the one at `start`, skipping quoted strings."""
    depth, i = 0, start
    while i < len(text):
        ch = text[i]
        if ch == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError(f"unbalanced {text[start]!r} at column {start}: {text[start : start + 80]}")


def _split_top_level(text: str) -> Iterator[str]:
    """Comma-separated items outside brackets and quotes."""
    depth, start, i = 0, 0, 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        elif ch == "," and depth == 0:
            yield text[start:i].strip()
            start = i + 1
        i += 1
    if text[start:].strip():
        yield text[start:].strip()


def _shape_end(text: str) -> int:
    """Where the shape that starts `text` ends: `(tuple, ...)`, or `f32[8,16]{1,0:T(8,128)}`."""
    if text.startswith("("):
        return _close(text, 0) + 1
    i = text.index("[")
    i = _close(text, i) + 1
    if i < len(text) and text[i] == "{":
        i = _close(text, i) + 1
    return i


def parse_instruction(line: str) -> TextInstruction | None:
    """One instruction line, or None for anything else (headers, stack-frame tables, braces)."""
    m = _INSTRUCTION.match(line)
    if not m:
        return None
    rest = line[m.end() :]
    rest = rest[_shape_end(rest) :].lstrip()
    paren = rest.index("(")
    opcode = rest[:paren]
    close = _close(rest, paren)
    inside = rest[paren + 1 : close]
    operands: tuple[str, ...] = ()
    if opcode not in ("constant", "parameter") and inside.strip():
        # `%x`, `x` or `f32[8]{0} %x`, after an `/*index=5*/` comment in long lists: the name is the last word.
        operands = tuple(item.split()[-1].lstrip("%") for item in _split_top_level(_COMMENT.sub("", inside)))
    callees: list[str] = []
    sharding = None
    for item in _split_top_level(rest[close + 1 :].lstrip(", ")):
        key, _, value = item.partition("=")
        if key == "sharding":
            sharding = value
        elif key in _CALLEE_KEYS:
            callees += [c.strip().lstrip("%") for c in value.strip("{}").split(",") if c.strip()]
    number = int(inside) if opcode == "parameter" else None
    return TextInstruction(m.group(2), opcode, operands, tuple(callees), sharding, number)


def read_module(text: str) -> dict[str, TextComputation]:
    """Computations by name, in file order."""
    computations: dict[str, TextComputation] = {}
    current: dict[str, TextInstruction] | None = None
    name, root, is_entry = "", "", False
    for line in text.splitlines():
        if current is None:
            if not line.startswith("HloModule") and (m := _COMPUTATION.match(line)):
                current, name, root, is_entry = {}, m.group(2), "", bool(m.group(1))
            continue
        if line.startswith("}"):
            computations[name] = TextComputation(name, _with_elided_elements(current), root, is_entry)
            current = None
            continue
        inst = parse_instruction(line)
        if inst is not None:
            current[inst.name] = inst
            if line.lstrip().startswith("ROOT"):
                root = inst.name
    return computations


def _with_elided_elements(instructions: dict[str, TextInstruction]) -> dict[str, TextInstruction]:
    """Each `t#k` operand (today's XLA elides a get-tuple-element and names element k of `t` so; `t#i#j` is
    element j of element i) as the get-tuple-element it stands for. Its sharding is not printed."""
    elements: dict[str, TextInstruction] = {}
    for inst in instructions.values():
        for operand in inst.operands:
            while "#" in operand and operand not in instructions and operand not in elements:
                base = operand.rsplit("#", 1)[0]
                elements[operand] = TextInstruction(operand, "get-tuple-element", (base,), (), None)
                operand = base
    return {**instructions, **elements}


def instruction_shardings(computations: dict[str, TextComputation]) -> dict[str, str]:
    """{instruction name: sharding text} for every instruction that carries one."""
    return {i.name: i.sharding for c in computations.values() for i in c.instructions.values() if i.sharding}


def entry(computations: dict[str, TextComputation]) -> TextComputation:
    (found,) = (c for c in computations.values() if c.is_entry)
    return found


# A source instruction reached through calls: (the call sites from the outermost, computation, name).
_Node = tuple[tuple[tuple[str, str], ...], str, str]


def source_names(source: dict[str, TextComputation], inlined: dict[str, TextComputation]) -> dict[str, str]:
    """XLA's name of each instruction after its CallInliner -> the instruction's name in `source`.

    XLA inlines every `call` before propagation and names the clones afresh (`mul.75` in a callee
    becomes `multiply.2` or `mul.2`), so the two modules are walked side by side from each
    computation's root, operand by operand, descending into `call`s on the source side. A clone of a
    callee called from several sites is named `name@call`, `name@inner/outer` through nested calls
    (the path notation the planner's inliner answers to); one called once keeps its own name.
    Instructions not reached from a root (dead code) keep their name when the source has it.
    """
    sites = Counter(c for comp in source.values() for i in comp.instructions.values() if i.opcode == "call"
                    for c in i.callees)  # fmt: skip
    mapping: dict[str, str] = {}
    paired: set[tuple[str, str]] = set()

    def resolve(node: _Node) -> _Node:
        path, comp, name = node
        while True:
            inst = source[comp].instructions[name]
            if inst.opcode == "call":
                path, comp = (*path, (comp, name)), inst.callees[0]
                name = source[comp].root
            elif inst.opcode == "parameter" and path:
                (caller, call), path = path[-1], path[:-1]
                comp, name = caller, source[caller].instructions[call].operands[inst.parameter_number or 0]
            else:
                return path, comp, name

    def display(node: _Node) -> str:
        path, _, name = node
        shared = [call for caller, call in reversed(path) if sites[source[caller].instructions[call].callees[0]] > 1]
        return f"{name}@{'/'.join(shared)}" if shared else name

    def walk(pairs: list[tuple[_Node, str, str]]) -> None:
        while pairs:
            node, xla_comp, xla_name = pairs.pop()
            if xla_name in mapping:
                continue
            node = resolve(node)
            ours, theirs = source[node[1]].instructions[node[2]], inlined[xla_comp].instructions[xla_name]
            if ours.opcode != theirs.opcode or len(ours.operands) != len(theirs.operands):
                continue
            mapping[xla_name] = display(node)
            pairs += [((node[0], node[1], a), xla_comp, b) for a, b in zip(ours.operands, theirs.operands)]
            for a, b in zip(ours.callees, theirs.callees):
                if (a, b) not in paired and a in source and b in inlined:
                    paired.add((a, b))
                    pairs += pair_roots(a, b)

    def pair_roots(ours: str, theirs: str) -> list[tuple[_Node, str, str]]:
        a, b = source[ours], inlined[theirs]
        params = {i.parameter_number: i.name for i in b.instructions.values() if i.opcode == "parameter"}
        pairs: list[tuple[_Node, str, str]] = [(((), ours, a.root), theirs, b.root)]
        for i in a.instructions.values():
            if i.opcode == "parameter" and i.parameter_number in params:
                pairs.append((((), ours, i.name), theirs, params[i.parameter_number]))
        return pairs

    source_entry, inlined_entry = entry(source), entry(inlined)
    paired.add((source_entry.name, inlined_entry.name))
    walk(pair_roots(source_entry.name, inlined_entry.name))
    known = {name for comp in source.values() for name in comp.instructions}
    for comp in inlined.values():
        for name in comp.instructions:
            if name not in mapping and name in known:
                mapping[name] = name
    return mapping

"""The parser's fast paths read every text as its line-by-line reference reading does.

`instruction_parser` reads most lines from one regex pass over the text (rows), typed lines
(torch_xla's inline operand types) from cached parts, and caches checks by the identity of shared
objects. The reference below reads each instruction where the previous one ended: a simple line
when `_SIMPLE_LINE` reads it there, else the general path, with every check made afresh. Both
must give the same module (lines and attribute texts included) or the same error at the same
line and column, on real dumps, on XLA's cases, on those written with inline operand types, and
on broken variants of all of them.
"""

from __future__ import annotations

import random
import re

import pytest
from conftest import CORPUS, xla_cases

from planner.errors import HloParseError
from planner.hlo.ir.module import HloModule
from planner.hlo.ir.opcodes import arity_problem
from planner.hlo.text import instruction_parser as ip
from planner.hlo.text import parser
from planner.hlo.text.compat import for_jaxlib_0_7
from planner.hlo.text.parse_state import ParseState, Scope
from planner.hlo.text.printer import print_module

_TOKEN = re.compile(r"[%\w.\-]+|[{}()\[\],=:]")
_JUNK = ["{", "}", "(", ")", ",", ", ", "=", "%", " /* c */ ", "\n", "\n  ", '"', "f32[2]{0} ", "ROOT ", "/*index=5*/"]


def _reference_body(state: ParseState, scope: Scope) -> tuple[list, str | None]:
    text, c, defined = state.text, state.cursor, scope.defined
    instructions: list = []
    root: str | None = None
    pos = c.pos
    while True:
        read = ip._read_line(state, scope, pos, 0, "", "", "", "", "", "")
        if read is not None:
            is_root, inst, located, anchor, operand_shapes, entry, pos = read
            low, high, check = entry[3], entry[4], entry[5]
            if not low <= len(inst.operands) <= high:
                problem = arity_problem(inst.opcode, len(inst.operands))
                if problem:
                    c.fail(problem, ip._position(state, located, anchor, 4))
            if check:
                problem, at_opcode = ip._check_problem(inst, operand_shapes, check)
                if problem:
                    c.fail(problem, ip._position(state, located, anchor, 4 if at_opcode else 2))
            start = ip._position(state, located, anchor, 2) if is_root and root is not None else 0
        else:
            c.pos = pos
            start = c.skip_space()
            if text.startswith("}", start):
                c.pos = start + 1
                return instructions, root
            if start >= len(text):
                c.fail(f"input ends inside computation '{scope.name}': expected '}}'")
            is_root, inst, start, opcode_pos = ip._parse_general(state, scope)
            ip._check_general(state, scope, inst, start, opcode_pos)
            pos = c.pos
        if is_root:
            if root is not None:
                ip._second_root(state, scope, root, start)
            root = inst.name
        defined[inst.name] = inst
        instructions.append(inst)


def _outcome(text: str) -> tuple:
    try:
        module = parser.parse_hlo(text, source="x")
    except HloParseError as e:
        return ("error", e.line, e.column, e.message)
    details = [(i.line, tuple(a.text for a in i.attributes)) for comp in module.computations for i in comp]
    return ("module", module, [c.line for c in module.computations], details)


def _typed(module: HloModule) -> str:
    """The module printed with each operand's type before it, as torch_xla prints."""
    lines = print_module(module).split("\n")
    instructions = iter([(comp, inst) for comp in module.computations for inst in comp])
    for k, line in enumerate(lines):
        if not line.startswith("  "):
            continue
        comp, inst = next(instructions)
        if inst.operands and inst.opcode not in ("parameter", "constant"):
            plain = f" {inst.opcode}({', '.join(f'%{o}' for o in inst.operands)})"
            typed = ", ".join(f"{comp[o].shape.to_text()} %{o}" for o in inst.operands)
            lines[k] = line.replace(plain, f" {inst.opcode}({typed})", 1)
    return "\n".join(lines)


def _mutate(text: str, rnd: random.Random) -> str:
    for _ in range(rnd.randint(1, 3)):
        kind = rnd.randrange(5)
        if kind == 0:
            text = text[: rnd.randrange(len(text) + 1)]
        elif kind == 1:
            at = rnd.randrange(len(text) + 1)
            text = text[:at] + rnd.choice(_JUNK) + text[at:]
        elif kind == 2:
            tokens = list(_TOKEN.finditer(text))
            if tokens:
                a, b = rnd.choice(tokens), rnd.choice(tokens)
                text = text[: a.start()] + b.group() + text[a.end() :]
        elif kind == 3:
            lines = text.split("\n")
            i = rnd.randrange(len(lines))
            lines.insert(rnd.randrange(len(lines)), lines[i])
            text = "\n".join(lines)
        else:
            at = rnd.randrange(len(text) + 1)
            text = text[:at] + text[at + 1 :]
    return text


def _texts() -> list[tuple[str, str]]:
    rnd = random.Random(0)
    cases = [c["hlo"] for c in xla_cases()]
    typed = [_typed(parser.parse_hlo(hlo)) for hlo in cases[::3]]
    small = [for_jaxlib_0_7((CORPUS / "torch_xla" / "llama_scan_L4_small.hlo").read_text())]
    texts = [(f"case{i}", t) for i, t in enumerate(cases[::4])] + [(f"typed{i}", t) for i, t in enumerate(typed)]
    texts += [("llama_scan_L4_small", small[0])]
    bases = cases + typed
    texts += [(f"mutated{i}", _mutate(rnd.choice(bases), rnd)) for i in range(300)]
    texts += [(f"mutated_dump{i}", _mutate(small[0], rnd)) for i in range(8)]
    return texts


TEXTS = _texts()


@pytest.mark.parametrize("text", [t for _, t in TEXTS], ids=[name for name, _ in TEXTS])
def test_fast_paths_read_as_the_reference_does(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _outcome(text)
    monkeypatch.setattr(parser, "parse_body", _reference_body)
    assert _outcome(text) == fast


def test_the_texts_exercise_every_path(monkeypatch: pytest.MonkeyPatch) -> None:
    typed, general = [], []
    read_typed, read_general = ip._read_typed_line, ip._parse_general
    monkeypatch.setattr(ip, "_read_typed_line", lambda *a: typed.append(read_typed(*a)) or typed[-1])
    monkeypatch.setattr(ip, "_parse_general", lambda *a: general.append(1) or read_general(*a))
    for _, text in TEXTS:
        _outcome(text)
    assert any(typed) and not all(typed) and general

"""Every real dump and every XLA test case parses, and printing round-trips."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import corpus_hlo_files, xla_cases

from planner import HloModule, parse_hlo, parse_hlo_file, print_module
from planner.hlo.ir.shapes import TupleShape
from planner.hlo.text.compat import for_jaxlib_0_7

CORPUS_FILES = corpus_hlo_files()
CASES = xla_cases()


@pytest.mark.parametrize("path", CORPUS_FILES, ids=[p.name for p in CORPUS_FILES])
def test_corpus_file_parses_and_round_trips(path: Path) -> None:
    module = parse_hlo_file(path)
    assert module.num_instructions > 100
    assert module.entry.is_entry
    reprinted = parse_hlo(print_module(module))
    assert reprinted == module


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_xla_case_parses_and_round_trips(case: dict) -> None:
    module = parse_hlo(case["hlo"])
    assert parse_hlo(print_module(module)) == module


def test_corpus_and_cases_are_all_present() -> None:
    # The counts guard against a glob that silently matches nothing.
    assert len(CORPUS_FILES) >= 15
    assert len(CASES) >= 150


def _structure(module: HloModule) -> dict[str, dict[str, tuple]]:
    return {
        comp.name: {
            inst.name: (
                inst.opcode,
                tuple((leaf.element_type, leaf.dims) for leaf in inst.shape.leaves()),
                inst.operands,
                inst.parameter_number,
                inst.sharding,
                inst.name == comp.root_name,
            )
            for inst in comp.instructions
        }
        for comp in module.computations
    }


def _anonymous(structure: dict[str, dict[str, tuple]]) -> dict[str, list[tuple]]:
    # XLA renames an instruction whose name another computation already uses,
    # so where names moved, compare everything but names and operand names.
    return {
        comp: sorted(
            ((v[0], v[1], len(v[2]), v[3], str(v[4]), v[5]) for v in insts.values()),
            key=repr,
        )
        for comp, insts in structure.items()
    }


INPUTS = [(p.name, p.read_text()) for p in CORPUS_FILES] + [(c["name"], c["hlo"]) for c in CASES]


@pytest.mark.xla
@pytest.mark.parametrize("name,text", INPUTS, ids=[n for n, _ in INPUTS])
def test_structure_matches_xlas_own_parser(name: str, text: str) -> None:
    """Our IR equals our reading of what XLA's parser printed back.

    Names, opcodes, shapes, operands, parameter numbers, roots and shardings
    (after XLA's own normalisation, e.g. one sharding expanded over a tuple).
    """
    from jax._src.lib import xla_client

    ours = parse_hlo(text)
    theirs = parse_hlo(xla_client._xla.hlo_module_from_text(for_jaxlib_0_7(text)).to_string())
    assert theirs.entry_name == ours.entry_name
    a, b = _structure(ours), _structure(theirs)
    names = lambda s: sorted(n for comp in s.values() for n in comp)  # noqa: E731
    if names(a) == names(b):
        assert a == b
    else:
        assert _anonymous(a) == _anonymous(b)


def test_captured_dump_has_inline_operand_types() -> None:
    """The client-captured form repeats whole tuple types on every operand (lines of many KB)."""
    path = next(p for p in CORPUS_FILES if p.name.endswith(".captured.hlo"))
    text = path.read_text()
    assert max(len(line) for line in text.splitlines()) > 5_000
    captured = parse_hlo(text)
    plain = parse_hlo_file(path.with_name(path.name.replace(".captured.hlo", ".hlo")))

    # Same step, same loops: the carried tuples have the same arity.
    def tuple_arities(m: HloModule) -> list[int]:
        return sorted(
            len(i.shape.elements)
            for c in m.computations
            for i in c
            if i.opcode == "while" and isinstance(i.shape, TupleShape)
        )

    assert tuple_arities(captured) == tuple_arities(plain)

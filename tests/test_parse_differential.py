"""Differential: our parser accepts exactly the HLO text XLA's own parser (jaxlib 0.7.1) accepts.

Inputs are real modules broken the way `test_fuzz` breaks them (truncation,
swapped tokens, deleted braces, huge dims, wrong operand counts, call cycles,
unicode names): mostly XLA's small propagation test modules, now and then a
slice of a corpus dump (one computation and every computation it calls). Each
goes to XLA's parser in a worker process and to ours. Both must accept, or
both reject; what we reject must carry a line and column. A disagreement is
allowed only where `DIFFERENCES` (we refuse, recognised by our error message)
or `LENIENCIES` (we accept, recognised by XLA's) names it.

Corpus dumps go through `compat.for_jaxlib_0_7` first, as in bench/parse.py:
newer XLA's debug tables and `stack_frame_id=` are syntax we read on purpose
and jaxlib 0.7.1 cannot, so they are left out of the comparison.

CI runs `SPMD_DIFF_EXAMPLES` inputs (300, derandomized); the recorded
5,000-input run is in bench/RESULTS.md. `SPMD_DIFF_REPORT=path` writes the
outcome counts there as JSON.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache

import pytest
from conftest import corpus_hlo_files, xla_cases
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz import mutate
from xla_parser_oracle import XlaParser, XlaVerdict

from planner.errors import HloParseError
from planner.hlo.text.compat import for_jaxlib_0_7
from planner.hlo.text.opcode_attributes import KNOWN_KEYS, MODULE_ATTRIBUTES
from planner.hlo.text.parser import parse_hlo

pytestmark = pytest.mark.xla

EXAMPLES = int(os.environ.get("SPMD_DIFF_EXAMPLES", "300"))


@dataclass(frozen=True)
class Difference:
    """A deliberate disagreement: we reject text XLA's parser accepts."""

    name: str
    applies: Callable[[str, HloParseError, XlaParser], bool]
    reason: str


def _message(pattern: str) -> Callable[[str, HloParseError, XlaParser], bool]:
    regex = re.compile(pattern)
    return lambda text, error, xla: regex.search(error.message) is not None


def _dropped_operand(text: str, error: HloParseError, xla: XlaParser) -> bool:
    """XLA skipped the operand we refused: without it, XLA reads the same module."""
    if not re.match(r"operand '[^']*' of '[^']*' is not defined|expected an operand name", error.message):
        return False
    lines = text.split("\n")
    line, at = lines[error.line - 1], error.column - 1
    begin = max(line.rfind(",", 0, at), line.rfind("(", 0, at)) + 1
    ends = [i for i in (line.find(",", at), line.find(")", at)) if i >= 0]
    if not begin or not ends:
        return False
    end = min(ends)
    if line[end] == ",":
        lines[error.line - 1] = line[:begin] + line[end + 1 :].lstrip()
    else:  # the last operand goes with the comma before it
        lines[error.line - 1] = line[: begin - 1] + line[end:] if line[begin - 1] == "," else line[:begin] + line[end:]
    without = xla.parse("\n".join(lines))
    return without.accepted and without.text == xla.parse(text).text


# Every place our parser refuses text that XLA's parser takes. The first four
# are checks XLA makes in its verifier (HloVerifier, which
# `hlo_module_from_text` does not run) and the planner makes while parsing, so
# that a module that could never compile fails at the line that is wrong.
DIFFERENCES = [
    Difference(
        "verifier: shape fits operands and attributes",
        _message(r"^'[^']*': "),
        "ShapeVerifier checks each instruction's shape against ShapeInference (elementwise dims, broadcast, "
        "dot, slice, reduce, gather dims ...); propagation and memory index dims by these attributes.",
    ),
    Difference(
        "verifier: tuple shapes",
        _message(
            r"^tuple element \d+ is declared|^tuple has \d+ operands but its shape has|^a tuple has a tuple "
            r"shape|^get-tuple-element is declared|^get-tuple-element index -?\d+ is out of range"
        ),
        "ShapeVerifier requires a tuple's shape to be its operands' and a get-tuple-element's to be the element "
        "it names; with the shape written, XLA's parser checks neither.",
    ),
    Difference(
        "verifier: sharding fits the device list and the shape",
        _message(
            r"does not fit its shape|devices listed but tile dims|repeats a device or has a negative id|"
            r"tile assignment dims \[[^\]]*\] must be positive|has \d+ devices but tile dims|has no room for"
        ),
        "HloSharding::Validate (verifier) refuses these; XLA's parser copies a device list of the wrong length "
        "into the tile array unchecked (reading past it, or leaving zeros).",
    ),
    Difference(
        "verifier: layout is an order of the dims",
        _message(r"layout \{[^}]*\} is not an order of the \d+ dims"),
        "LayoutUtil::ValidateLayoutInShape (verifier) refuses minor_to_major lists that are not a permutation; "
        "XLA's parser checks only their length (and checks permutations inside tuple shapes).",
    ),
    Difference(
        "XLA accident: an unreadable operand before a comma is dropped",
        _dropped_operand,
        "XLA's ParseOperands records 'cannot parse as an instruction name' and carries on at the comma without "
        "failing, so `add(f32, x, y)` reads as add(x, y). The error is lost, not intended.",
    ),
]

# Every place our parser takes text that XLA's parser refuses, recognised by XLA's error.
_UNEXPECTED_ATTRIBUTE = re.compile(r'unexpected attribute "([^"]+)"')


def _new_attribute(xla_error: str) -> bool:
    m = _UNEXPECTED_ATTRIBUTE.search(xla_error)
    return m is not None and m.group(1) not in KNOWN_KEYS | MODULE_ATTRIBUTES


LENIENCIES = {
    "newer XLA: an attribute name jaxlib 0.7.1 knows nowhere is kept": (
        _new_attribute,
        "XLA after jaxlib 0.7.1 adds instruction and header attributes (the corpus's JAX dumps come from a newer "
        "XLA); an attribute the planner does not model is kept verbatim, not refused. A name jaxlib 0.7.1 knows "
        "for other opcodes is refused on the wrong one, as XLA refuses it.",
    ),
}

# --- inputs --------------------------------------------------------------------------------------

_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+)[^\n]*\{\n.*?^\}\n", re.M | re.S)


@cache
def _corpus() -> list[tuple[str, list[tuple[str, str]]]]:
    """Each corpus dump (as jaxlib 0.7.1 reads it) as (module name, [(computation name, text)])."""
    modules = []
    for path in corpus_hlo_files():
        text = for_jaxlib_0_7(path.read_text())
        name = re.match(r"HloModule ([\w.\-]+)", text).group(1)  # type: ignore[union-attr]
        modules.append((name, [(m.group(1), m.group(0)) for m in _COMPUTATION.finditer(text)]))
    return modules


def corpus_slice(module: int, computation: float) -> str:
    """One computation of a dump and every computation it calls, in their order: a module of its own."""
    name, computations = _corpus()[module]
    index = int(computation * (len(computations) - 1))
    bodies = dict(computations)
    needed, todo = {computations[index][0]}, [computations[index][1]]
    while todo:
        for ref in re.findall(r"%([\w.\-]+)", todo.pop()):
            if ref in bodies and ref not in needed:
                needed.add(ref)
                todo.append(bodies[ref])
    kept = [body for n, body in computations[: index + 1] if n in needed]
    return f"HloModule {name}\n\n" + "\n".join(kept)


@st.composite
def mutated(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 9)) == 0:
        text = corpus_slice(draw(st.integers(0, len(_corpus()) - 1)), draw(st.floats(0, 1)))
    else:
        text = draw(st.sampled_from(xla_cases()))["hlo"]
    return mutate(draw, text)


# --- the test ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def xla() -> Iterator[XlaParser]:
    with XlaParser() as parser:
        yield parser


@pytest.fixture(scope="module")
def outcomes(xla: XlaParser) -> Iterator[Counter[str]]:
    counts: Counter[str] = Counter()
    start = time.monotonic()
    yield counts
    summary = {"seconds": round(time.monotonic() - start, 1), "xla_restarts": xla.num_restarts, **counts}
    print("\ndifferential parse outcomes:", json.dumps(summary, indent=1))
    if os.environ.get("SPMD_DIFF_REPORT"):
        with open(os.environ["SPMD_DIFF_REPORT"], "w") as f:
            json.dump(summary, f, indent=1)


def compare(text: str, xla: XlaParser) -> str:
    """The outcome's name: 'accepted by both', 'rejected by both' or a DIFFERENCES row; raises otherwise."""
    verdict: XlaVerdict = xla.parse(text)
    try:
        parse_hlo(text, source="mutated")
    except HloParseError as error:
        lines = text.split("\n")
        assert 1 <= error.line <= len(lines) and 1 <= error.column <= len(lines[error.line - 1]) + 1, error
        if not verdict.accepted:
            return "rejected by both"
        row = next((d for d in DIFFERENCES if d.applies(text, error, xla)), None)
        assert row is not None, f"we reject what XLA accepts:\n{error}"
        return row.name
    if verdict.accepted:
        return "accepted by both"
    row = next((name for name, (applies, _) in LENIENCIES.items() if applies(verdict.error)), None)
    assert row is not None, f"we accept what XLA rejects:\n{verdict.error[:2000]}"
    return row


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=EXAMPLES <= 300)
@given(text=mutated())
def test_we_accept_exactly_what_xla_accepts(text: str, xla: XlaParser, outcomes: Counter[str]) -> None:
    outcomes["mutated inputs"] += 1
    outcomes[compare(text, xla)] += 1


def test_unmutated_inputs_are_accepted_by_both(xla: XlaParser) -> None:
    texts = [case["hlo"] for case in xla_cases()] + [for_jaxlib_0_7(path.read_text()) for path in corpus_hlo_files()]
    for text in texts:
        assert compare(text, xla) == "accepted by both"


def test_each_difference_is_recognised(xla: XlaParser) -> None:
    """One known input per row, so a row that no longer matches anything is noticed."""
    head = "HloModule m\n\nENTRY e {\n  a = f32[4] parameter(0)\n"
    examples = {
        "verifier: shape fits operands and attributes": head + "  ROOT r = f32[5] negate(a)\n}\n",
        "verifier: tuple shapes": head + "  ROOT t = (f32[5]) tuple(a)\n}\n",
        "verifier: sharding fits the device list and the shape": head.replace(
            "parameter(0)", "parameter(0), sharding={devices=[2]0,0}"
        )
        + "  ROOT r = f32[4] negate(a)\n}\n",
        "verifier: layout is an order of the dims": head + "  ROOT r = f32[4,2]{0,0} parameter(1)\n}\n",
        "XLA accident: an unreadable operand before a comma is dropped": head + "  ROOT r = f32[4] add(a, f32, a)\n}\n",
    }
    examples["newer XLA: an attribute name jaxlib 0.7.1 knows nowhere is kept"] = head + (
        "  ROOT r = f32[4] negate(a), result_layout_hint={1}\n}\n"
    )
    assert set(examples) == {d.name for d in DIFFERENCES} | set(LENIENCIES)
    for name, text in examples.items():
        assert compare(text, xla) == name

"""Property: mutated real HLO either parses and plans, or fails with the documented errors, in bounded time.

Seeds are real modules (XLA's propagation test cases and a torch_xla scan
step); mutations are what broken dumps look like: truncation, swapped
tokens, deleted braces, huge dims, wrong operand counts, a While whose body
calls back into its caller, and unicode in names. The documented outcomes are
success, `HloParseError` (with a line and column inside the text), another
`PlannerError`, or `ValueError` for input the planner cannot size (both with a
message). Anything else, or an input that runs past its time bound, fails.

CI runs a small budget; `SPMD_FUZZ_EXAMPLES=5000` runs the large one.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

from conftest import CORPUS, REPO, xla_cases
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.errors import HloParseError, PlannerError
from planner.hlo.text.parser import parse_hlo
from planner.plan.planner import make_plan
from planner.prepare import prepare

sys.path.insert(0, str(REPO / "bench"))
from fuzz_surfaces import time_bound

EXAMPLES = int(os.environ.get("SPMD_FUZZ_EXAMPLES", "150"))
SECONDS_PER_INPUT = 30
FIXTURES = Path(__file__).parent / "fixtures"
SEEDS = (
    [case["hlo"] for case in xla_cases()]
    + [p.read_text() for p in sorted((Path(__file__).parent / "golden").glob("*.hlo"))]
    + [(FIXTURES / "shardy_constraints.hlo").read_text()]
    + [(CORPUS / "torch_xla" / "llama_scan_L4_small.hlo").read_text()]
)
_TOKEN = re.compile(r"[%\w.\-]+|[{}()\[\],=:]")


def truncate(text: str, at: float) -> str:
    return text[: int(len(text) * at)]


def swap_tokens(text: str, i: float, j: float) -> str:
    tokens = list(_TOKEN.finditer(text))
    if len(tokens) < 2:
        return text
    a, b = sorted((tokens[int(i * (len(tokens) - 1))], tokens[int(j * (len(tokens) - 1))]), key=lambda m: m.start())
    if a.start() == b.start():
        return text
    return text[: a.start()] + b.group() + text[a.end() : b.start()] + a.group() + text[b.end() :]


def delete_brace(text: str, k: float) -> str:
    braces = [m.start() for m in re.finditer(r"[{}]", text)]
    if not braces:
        return text
    at = braces[int(k * (len(braces) - 1))]
    return text[:at] + text[at + 1 :]


def huge_dims(text: str, k: float) -> str:
    dims = list(re.finditer(r"(?<=[\[,])\d+(?=[\],])", text))
    if not dims:
        return text
    m = dims[int(k * (len(dims) - 1))]
    return text[: m.start()] + "9223372036854775807" + text[m.end() :]


def wrong_arity(text: str, k: float) -> str:
    calls = list(re.finditer(r"\b(add|multiply|dot|tuple|get-tuple-element|reshape|broadcast)\((%?[\w.\-]+)", text))
    if not calls:
        return text
    m = calls[int(k * (len(calls) - 1))]
    return text[: m.end()] + ", " + m.group(2) + text[m.end() :]


def while_cycle(text: str, k: float) -> str:
    """Point a While's body at the computation that holds it (or a call at its caller)."""
    bodies = list(re.finditer(r"body=%?([\w.\-]+)", text))
    entry = re.search(r"ENTRY %?([\w.\-]+)", text)
    if not bodies or entry is None:
        return text.replace("to_apply=", "to_apply=%" + (entry.group(1) if entry else "x") + ", ignored=", 1)
    m = bodies[int(k * (len(bodies) - 1))]
    return text[: m.start(1)] + entry.group(1) + text[m.end(1) :]


def unicode_names(text: str, k: float) -> str:
    names = list(re.finditer(r"%([\w.\-]+)", text))
    if not names:
        return text
    name = names[int(k * (len(names) - 1))].group(1)
    return text.replace(name, name + "_ω·名")


MUTATIONS = [truncate, delete_brace, huge_dims, wrong_arity, while_cycle, unicode_names]


@st.composite
def mutated(draw: st.DrawFn) -> str:
    # One draw in four mutates the torch_xla step (a real scan, slow to plan), the rest XLA's small cases.
    text = SEEDS[-1] if draw(st.integers(0, 3)) == 0 else draw(st.sampled_from(SEEDS[:-1]))
    return mutate(draw, text)


def mutate(draw: st.DrawFn, text: str) -> str:
    """One to three mutations of `text`: swapped tokens or one of MUTATIONS."""
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            text = swap_tokens(text, draw(st.floats(0, 1)), draw(st.floats(0, 1)))
        else:
            text = draw(st.sampled_from(MUTATIONS))(text, draw(st.floats(0, 1)))
    return text


def outcome(text: str) -> str:
    """'planned', or the documented error's kind; raises on anything undocumented."""
    try:
        module = parse_hlo(text, source="fuzz")
    except HloParseError as e:
        lines = text.split("\n")
        assert 1 <= e.line <= len(lines) + 1 and e.column >= 1 and e.message, e
        return "parse error"
    try:
        make_plan(prepare(module))
    except PlannerError as e:
        assert str(e)
        return type(e).__name__
    except ValueError as e:
        assert str(e)
        return "ValueError"
    return "planned"


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=EXAMPLES <= 150)
@given(mutated())
def test_mutated_hlo_plans_or_fails_as_documented(text: str) -> None:
    start = time.monotonic()
    with time_bound(SECONDS_PER_INPUT):
        outcome(text)
    assert time.monotonic() - start < SECONDS_PER_INPUT


def test_each_mutation_changes_real_text() -> None:
    seed = SEEDS[-1]
    for mutation in MUTATIONS:
        assert mutation(seed, 0.5) != seed, mutation.__name__
    assert swap_tokens(seed, 0.1, 0.9) != seed

"""Our rule for every op of Shardy's propagation lit tests equals the one the installed jaxlib 0.12's Shardy
gives it.

The registry's own lit files (`test_shardy_rules_jax012.py`) print one rule per case; the propagation tests
(`shared/shardy_cases_jax012`, openxla/shardy@a0277a83) run ops of every kind through the rules, so each of
their ops is asked too: jaxlib's `sdy-populate-op-sharding-rules` prints its rule at test time
(`fidelity.shardy_printed_rules`, conservative where the case's pipeline is), and our registry answers for
the HLO instruction the converter writes for the op, found by the location both carry. The module is read
in the form the lit runner hands the engine (`fidelity.shardy_lit.readable_module`), else as written (a
callee the runner makes opaque is only there). Runs on the jax 0.12 environment (`make test-jax-today`).
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest
from conftest import SHARED
from test_shardy_rules import case_id, rule_text

from planner import parse_hlo
from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.hlo.text.stablehlo_text import read_stablehlo
from planner.propagation.shardy.release import ShardyRelease

RELEASE = ShardyRelease.JAXLIB_0_12
CASES = SHARED / "shardy_cases_jax012" / "shardy_propagation_cases.json"

if ShardyRelease.installed() is not RELEASE:
    pytest.skip("the rules are printed by jaxlib 0.12's own Shardy: run on the jax 0.12 environment",
                allow_module_level=True)  # fmt: skip

from fidelity.shardy_lit import passes_of, readable_module  # noqa: E402
from fidelity.shardy_printed_rules import PrintedRule, printed_rules  # noqa: E402
from fidelity.shardy_regen import Shardy  # noqa: E402
from fidelity.written_edges import take_written_edges  # noqa: E402

# (case id, location) -> why no HLO instruction is the op: the converter folds it before anything reads it
# (the lit suite's NOT_READABLE cases, whose values no compile propagates either).
FOLDED: dict[tuple[str, str], str] = {
    ("propagation_pipeline/case_propagate_mulitple_uses", "l686c8"): "subtract(x, x) folded into a constant",
    ("propagation_pipeline/case_propagate_mulitple_uses", "l687c8"): "subtract(x, x) folded into a constant",
    ("propagation_pipeline_data_flow_edges/case_propagate_mulitple_uses", "l322c8"): (
        "subtract(x, x) folded into a constant"
    ),
    ("propagation_pipeline_data_flow_edges/case_propagate_mulitple_uses", "l323c8"): (
        "subtract(x, x) folded into a constant"
    ),
    ("propagation_pipeline/main@l971", "l994c8"): "the callee's subtract(x, x) folded into a constant",
    ("propagation_pipeline_data_flow_edges/main@l607", "l630c8"): "the callee's subtract(x, x) folded into a constant",
    ("basic_propagation/pointwise_size_zero_dim", "l28c8"): "an add of zero elements written as a constant",
    ("basic_propagation/pointwise_size_zero_dim_axis_size_1", "l40c8"): "an add of zero elements written as a constant",
}
# The one case the converter refuses whole (a dynamically shaped result), as XLA's compile does.
UNCONVERTIBLE = {"basic_propagation/dynamic_shaped_func_output_skipped"}


@cache
def _cases() -> tuple[dict[str, Any], ...]:
    cases = json.loads(CASES.read_text())["cases"]
    return tuple(c for c in cases if c["kind"] != "rule" and c.get("expect") and case_id(c) not in UNCONVERTIBLE)


@cache
def _printed() -> dict[str, dict[str, PrintedRule]]:
    shardy = Shardy("")
    return {case_id(c): printed_rules(shardy, c["module"], _conservative(c)) for c in _cases()}


def _conservative(case: dict[str, Any]) -> bool:
    return "conservative-propagation=true" in case["pipeline"]


@cache
def _readable(name: str) -> HloModule:
    case = next(c for c in _cases() if case_id(c) == name)
    readable, _ = readable_module(case["module"], passes_of(case["pipeline"]))
    text, _ = take_written_edges(readable)
    return parse_hlo(read_stablehlo(text))


@cache
def _as_written(name: str) -> HloModule:
    case = next(c for c in _cases() if case_id(c) == name)
    return parse_hlo(read_stablehlo(case["module"]))


def _instruction(name: str, location: str) -> tuple[HloModule, Computation, Instruction]:
    """The last instruction under `location` that is the op itself (`test_shardy_rules.op_instruction`), not
    one of the converter's Shardy carriers (`xla.sdy.*` calls hold a function's shardings there too): in the
    module as the lit runner writes it, else as the test writes it."""
    for read in (_readable, _as_written):
        module = read(name)
        found = [
            (module, comp, inst)
            for comp in module.computations
            for inst in comp
            if inst.metadata is not None
            and inst.metadata.op_name == location
            and inst.opcode not in ("parameter", "tuple", "get-tuple-element")
            and not str(inst.attr("custom_call_target", "")).startswith("xla.sdy.")
        ]
        if found:
            return found[-1]
    raise AssertionError(f"no HLO instruction carries location {location}")


def _params() -> list[Any]:
    params = []
    for case in _cases():
        for location, printed in sorted(_printed()[case_id(case)].items()):
            folded = FOLDED.get((case_id(case), location))
            marks = [pytest.mark.xfail(reason=folded, raises=AssertionError, strict=True)] if folded else []
            params.append(pytest.param(case, location, printed, id=f"{case_id(case)}@{location}", marks=marks))
    return params


@pytest.mark.parametrize(("case", "location", "printed"), _params())
def test_our_rule_equals_the_one_jaxlib_prints(case: dict[str, Any], location: str, printed: PrintedRule) -> None:
    module, comp, inst = _instruction(case_id(case), location)
    rule = rule_text(module, comp, inst, location, _conservative(case), RELEASE)
    assert rule == printed.rule, printed.op


def test_every_op_kind_of_the_lit_files_is_asked() -> None:
    """The ops asked: every one the propagation tests give a rule (as measured: 389 ops of 18 kinds, the
    registry's own lit files cover the other kinds)."""
    printed = [rule for rules in _printed().values() for rule in rules.values()]
    assert len(printed) == 389
    assert len({rule.op for rule in printed}) == 18

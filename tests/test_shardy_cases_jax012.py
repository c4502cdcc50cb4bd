"""Shardy's own propagation lit tests as jax 0.12's Shardy runs them, through our Shardy engine.

Each case is one test function of `shardy/dialect/sdy/transforms/propagation/{test,debugging/test}` at
openxla/shardy@a0277a83, with the sharding jaxlib 0.12.0.1's real Shardy passes give each value
(`shared/shardy_cases_jax012`). The module is read as the planner reads StableHLO, through the installed
jaxlib's converter, so the suite runs on the jax 0.12 environment (`make test-jax-today`). A case that
does not pass yet is a strict xfail saying what differs; one that starts passing fails the suite, so
the table stays true.
"""

from __future__ import annotations

from functools import cache

import pytest
from conftest import SHARED

from fidelity.shardy_lit import CaseResult, load_cases, run_case, score

jax = pytest.importorskip("jax")
if tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 12):
    pytest.skip("these expectations are jax 0.12's Shardy: run on the jax 0.12 environment", allow_module_level=True)

CASES_FILE = SHARED / "shardy_cases_jax012" / "shardy_propagation_cases.json"

NOT_YET = {
    "basic_propagation.mlir::dynamic_shaped_func_output_skipped": (
        "a dynamically shaped result: jaxlib's converter to HLO fails ('Failed to get shape'), as XLA's own "
        "compile of the module does"
    ),
    "basic_propagation.mlir::pointwise_size_zero_dim": "a value with a zero-sized dim gets no sharding from us",
    "basic_propagation.mlir::pointwise_size_zero_dim_axis_size_1": (
        "a value with a zero-sized dim gets no sharding from us"
    ),
    "basic_propagation.mlir::main": "a call under a single propagation pass, without function edges: not modelled",
    "basic_propagation_token.mlir::main": "a token result beside an array result is not printed as Shardy prints it",
    "op_priority_propagation.mlir::manual_computation": (
        "a manual computation over no axes, read as a named computation, does not print its written "
        "in_shardings/out_shardings before its edges are sunk"
    ),
    "propagation_pipeline.mlir::sharding_constraint_applied": "the pipeline's closed result sharding is not written",
    "propagation_pipeline.mlir::case_propagate_mulitple_uses": "a case result with several uses misses one axis",
    "propagation_pipeline_data_flow_edges.mlir::case_propagate_mulitple_uses": (
        "a case result with several uses misses one axis"
    ),
    "propagation_pipeline.mlir::while_body_token_block_arg_skipped": (
        "the converter drops the loop's token element: the HLO while has 2 results where Shardy's has 3"
    ),
    "propagation_pipeline_data_flow_edges.mlir::while_body_token_block_arg_skipped": (
        "the converter drops the loop's token element: the HLO while has 2 results where Shardy's has 3"
    ),
    "propagation_pipeline.mlir::main@l971": (
        "the converter folds the callee's subtract(x, x) into a constant, so nothing links the call to its operand"
    ),
    "propagation_pipeline_data_flow_edges.mlir::main@l607": (
        "the converter folds the callee's subtract(x, x) into a constant, so nothing links the call to its operand"
    ),
    "propagation_pipeline_dedup_functions_fully_true.mlir::main@l87": (
        "dedup-functions-fully: one callee shared by every call, linked by function edges, is not modelled "
        "(each call propagates through a callee of its own)"
    ),
    "sharding_group_propagation.mlir::shard_as_applies_despite_barrier": (
        "the converter merges the test's two zero constants into one broadcast without a location"
    ),
}


@cache
def _cases() -> list[dict]:  # type: ignore[type-arg]
    return load_cases(CASES_FILE)


@cache
def _result(name: str) -> CaseResult:
    return run_case(next(c for c in _cases() if c["name"] == name))


def _params() -> list[object]:
    params = []
    for case in _cases():
        name = case["name"]
        reason = NOT_YET.get(name)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(name, marks=marks, id=name.replace(".mlir::", "/")))
    return params


@pytest.mark.parametrize("name", _params())
def test_every_value_equals_shardys(name: str) -> None:
    result = _result(name)
    assert result.error is None, result.error
    wrong = {k: (result.expected[k], result.got.get(k)) for k in result.missed}
    assert not wrong, wrong


def test_the_reasons_name_real_cases() -> None:
    names = {c["name"] for c in _cases()}
    assert set(NOT_YET) <= names


def test_values_equal_overall() -> None:
    """The share of all expected values our engine gives exactly, as measured (1,028 of 1,051)."""
    results = [_result(c["name"]) for c in _cases()]
    matched, expected = score(results)["*"]
    assert expected == 1051
    assert matched >= 1028, f"{matched} of {expected}"

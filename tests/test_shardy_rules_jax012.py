"""Shardy's sharding rule registry as jaxlib 0.12 writes it: every rule its registry tests print.

The reference rules are `sdy-populate-op-sharding-rules` of jaxlib 0.12.0.1 on `op_sharding_rule_registry*.mlir`
at openxla/shardy@a0277a83 (`shared/shardy_cases_jax012`), asked of `ShardyRelease.JAXLIB_0_12`. The
modules are read as in `test_shardy_rules.py`, through the installed jaxlib's converter, which writes some
ops otherwise than jaxlib 0.7's: the suite runs where jaxlib 0.12 is installed (`.venv-jax`) and skips
elsewhere. The rules that differ between releases are also checked without jaxlib, in
`test_shardy_rule_releases.py`.

Five expected rules have no HLO instruction that is their op; each is a strict xfail that says why.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest
from conftest import SHARED
from test_shardy_rules import assert_no_rule_anywhere, case_id, expected_rules, rule_at

from planner.propagation.shardy.release import ShardyRelease

RELEASE = ShardyRelease.JAXLIB_0_12
CASES = SHARED / "shardy_cases_jax012" / "shardy_propagation_cases.json"

if ShardyRelease.installed() is not RELEASE:
    pytest.skip(
        "these modules are read through jaxlib 0.12's converter, whose forms the xfails below name: run on the "
        "jax 0.12 environment",
        allow_module_level=True,
    )

# (case id, op location) -> why no HLO instruction carries the expected rule, and what the test meets instead.
# Each was read off the HLO jaxlib 0.12.0.1 converts the case's module to.
NOT_IN_HLO: dict[tuple[str, str], tuple[str, type[Exception]]] = {
    ("registry/pointwise_op_size_zero_dim", "l13c8"): (
        "jaxlib 0.12 writes an add of zero elements as a constant of zero elements, with no location",
        AssertionError,
    ),
    ("registry/broadcast_in_dim_size_zero_dim", "l106c8"): (
        "jaxlib 0.12 writes a broadcast_in_dim of zero elements as a constant of zero elements, with no location",
        AssertionError,
    ),
    ("registry/broadcast_in_dim_input_dim_expanded", "l120c8"): (
        "HLO's broadcast cannot expand a size-1 dim: jaxlib writes broadcast, reshape, broadcast, none of which "
        "is the op; the broadcast as StableHLO writes it is in test_shardy_rules.py's table",
        AssertionError,
    ),
    ("registry/all_to_all_same_dimension", "l58c10"): (
        "jaxlib 0.12, as 0.7, writes a multi-operand all_to_all as HLO's tuple all-to-all, which has no split or "
        "concat dimension (it exchanges whole operands): no rule",
        AssertionError,
    ),
    ("registry/all_to_all_different_dimensions", "l45c10"): (
        "jaxlib 0.12, as 0.7, writes a multi-operand all_to_all as HLO's tuple all-to-all, which has no split or "
        "concat dimension, and gives its results the operands' shapes: no rule",
        AssertionError,
    ),
}


@cache
def rule_cases() -> tuple[dict[str, Any], ...]:
    cases = json.loads(CASES.read_text())["cases"]
    return tuple(c for c in cases if c["kind"] == "rule")


@pytest.mark.parametrize(("case", "location", "expected"), expected_rules(rule_cases(), NOT_IN_HLO))
def test_rule_equals_shardys(case: dict[str, Any], location: str, expected: str) -> None:
    assert rule_at(case, location, RELEASE) == expected


@pytest.mark.parametrize("case", [pytest.param(c, id=case_id(c)) for c in rule_cases() if not c["rules"]])
def test_no_rule_where_shardy_prints_none(case: dict[str, Any]) -> None:
    """A reshape of zero elements and an unknown custom call: Shardy attaches no rule, nor do we."""
    assert_no_rule_anywhere(case, RELEASE)


def test_the_reasons_name_real_locations() -> None:
    known = {(case_id(c), location) for c in rule_cases() for location in c["rules"]}
    assert set(NOT_IN_HLO) <= known


def test_every_rule_is_checked() -> None:
    assert sum(len(c["rules"]) for c in rule_cases()) == 100

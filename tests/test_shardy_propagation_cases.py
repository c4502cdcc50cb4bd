"""Shardy's own propagation lit tests, run through our Shardy engine (`fidelity.shardy_lit`).

Each case is one test function of `shardy/dialect/sdy/transforms/propagation/{test,debugging/test}` at
openxla/shardy@5b3b2894 (jaxlib 0.7.1's Shardy), its module read as the planner reads StableHLO and
propagated by the passes its RUN line names; every value's sharding must equal what jaxlib's real Shardy
passes print for it. A case that does not pass yet is a strict xfail saying why: each cannot reach the
engine as the test wrote it (jaxlib's converter to HLO refuses or rewrites the input). A strict xfail that
starts passing fails the suite, so the table stays true. Named computations and hand-written data-flow
edges, which the converter refuses, are read in the form Shardy's own export writes
(`fidelity.named_computations`, `fidelity.written_edges`); an unused sharding constraint, which it drops,
is returned so that it reaches HLO (`fidelity.dangling_constraints`).
"""

from __future__ import annotations

import pytest
from conftest import SHARED
from lit_suite import LitSuite

from fidelity.shardy_lit import score

CASES_FILE = SHARED / "shardy_cases" / "shardy_propagation_cases.json"

NOT_READABLE = {
    "basic_propagation.mlir::dynamic_shaped_func_output_skipped": (
        "a dynamically shaped result: jaxlib's converter to HLO fails ('Failed to get shape'), as XLA's own "
        "compile of the module does (jax 0.12, either partitioner), so no step a user compiles holds one"
    ),
    "propagation_pipeline_data_flow_edges.mlir::while_body_token_block_arg_skipped": (
        "the converter drops the loop's token element: the HLO while has 2 results where Shardy's has 3"
    ),
    "sharding_group_propagation.mlir::shard_as_applies_despite_barrier": (
        "the converter merges the test's two zero constants into one broadcast without a location, so the "
        "grouped constant l12c8 has no instruction of its own"
    ),
}


SUITE = LitSuite(CASES_FILE)


@pytest.mark.parametrize("name", SUITE.params(NOT_READABLE))
def test_every_value_equals_shardys(name: str) -> None:
    result = SUITE.result(name)
    assert result.error is None, result.error
    wrong = {k: (result.expected[k], result.got.get(k)) for k in result.missed}
    assert not wrong, wrong


def test_the_reasons_name_real_cases() -> None:
    names = {c["name"] for c in SUITE.cases()}
    assert set(NOT_READABLE) <= names


def test_values_equal_overall() -> None:
    """The share of all expected values our engine gives exactly, as measured (878 of 883)."""
    results = SUITE.results()
    matched, expected = score(results)["*"]
    assert expected == 883
    assert matched >= 878, f"{matched} of {expected}"

"""Propagation behaviours worth pinning down beyond the reference files."""

from __future__ import annotations

import pytest

from planner import parse_hlo, parse_sharding
from planner.prepare import prepare
from planner.propagation import PropagationOptions, propagate

SPMD = PropagationOptions(is_spmd=True)


def test_unmodelled_ops_are_reported_not_guessed() -> None:
    module = parse_hlo(
        """HloModule m

ENTRY e {
  p = f32[8,16] parameter(0), sharding={devices=[4,1]<=[4]}
  k = f32[8,16] custom-call(p), custom_call_target="MyKernel"
  ROOT c = f32[8,16] copy(k)
}
"""
    )
    result = propagate(prepare(module, options=SPMD, pass_input=True))
    assert "k" in result.unknown and "MyKernel" in result.unknown["k"]
    assert result.sharding("k") is None  # not partitionable in XLA without a partitioner: no guess


def test_dot_contracting_axis_becomes_partial_replication() -> None:
    """The axis-dropping step: a mesh axis on a contracting dim is replicated in the result."""
    module = parse_hlo(
        """HloModule m

ENTRY e {
  a = f32[64,128] parameter(0), sharding={devices=[4,2]<=[8]}
  b = f32[128,256] parameter(1), sharding={devices=[2,4]<=[4,2]T(1,0)}
  ROOT d = f32[64,256] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""
    )
    options = PropagationOptions(is_spmd=True, allow_to_output=(True,))
    result = propagate(prepare(module, options=options, pass_input=True))
    # From a: rows in 4, its contracted 2-way split turns into replicas -> [4,1,2] replicated.
    # From b: columns in 4 -> [1,4,2] replicated. b is the larger operand and wins; the two
    # cannot combine (4x4 tiles on 8 devices), so a's row split is dropped.
    assert result.sharding("d") == parse_sharding("{devices=[1,4,2]<=[8] last_tile_dim_replicate}")
    provenance = result["d"].provenance
    assert provenance is not None and provenance.rule == "dot from larger operand" and provenance.sources == ("b",)


def test_shard_as_group_members_end_equal() -> None:
    module = parse_hlo(
        """HloModule m

ENTRY e {
  p = f32[8,16] parameter(0), sharding={devices=[4,2]<=[8]}
  q = f32[8,16] parameter(1)
  a = f32[8,16] custom-call(p), custom_call_target="Sharding", sharding={unknown shard_as 0}
  b = f32[8,16] custom-call(q), custom_call_target="Sharding", sharding={unknown shard_as 0}
  ROOT t = (f32[8,16], f32[8,16]) tuple(a, b)
}
"""
    )
    result = propagate(prepare(module, options=SPMD, pass_input=True))
    assert result.sharding("a") == result.sharding("b") == parse_sharding("{devices=[4,2]<=[8]}")


def test_iteration_backstop_names_the_instruction_that_kept_changing(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A fixed point not reached in the allowed iterations is a PlanningError naming the last change."""
    from planner.errors import PlanningError
    from planner.propagation.gspmd import driver

    module = parse_hlo(
        """HloModule m

ENTRY e {
  p = f32[8,16] parameter(0), sharding={devices=[4,2]<=[8]}
  n = f32[8,16] negate(p)
  ROOT c = f32[8,16] copy(n)
}
"""
    )
    monkeypatch.setattr(driver, "_MAX_ITERATIONS", 1)
    with pytest.raises(
        PlanningError,
        match=r"did not reach a fixed point in 1 iterations .*'n' \(negate in computation 'e', line 5\) kept changing, last to \{devices=\[4,2\]<=\[8\]\}",
    ):
        propagate(prepare(module, options=SPMD, pass_input=True))


def test_opcodes_without_a_rule_parse_and_are_left_unknown_with_a_reason() -> None:
    module = parse_hlo(
        """HloModule m

ENTRY e {
  p = f32[8,16] parameter(0), sharding={devices=[4,1]<=[4]}
  s = f32[16] parameter(1)
  o = f32[16] parameter(2)
  bn = (f32[8,16], f32[16], f32[16]) batch-norm-training(p, s, o), epsilon=0.001, feature_index=1
  cs = (f32[8,16], f32[8,16], u32[]) copy-start(p)
  cd = f32[8,16] copy-done(cs)
  ROOT t = (f32[8,16], f32[8,16]) tuple(cd, p)
}
"""
    )
    result = propagate(prepare(module, options=SPMD, pass_input=True))
    assert result.unknown == {
        "bn": "no propagation rule for batch-norm-training",
        "cs": "no propagation rule for copy-start",
        "cd": "no propagation rule for copy-done",
    }
    assert result.sharding("bn") is None and result.sharding("cd") is None

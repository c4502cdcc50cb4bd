"""XLA's own entries in Shardy's registry (`registry_xla`): each rule as XLA's `mhlo_extensions_test.mlir`
prints it (`sdy-populate-op-sharding-rules` over `mhlo.copy` and `mhlo.ragged_dot`), the op written as the
HLO instruction XLA's import makes it from."""

from __future__ import annotations

import pytest

from planner import parse_hlo
from planner.propagation.shardy.registry import sharding_rule
from planner.propagation.shardy.release import ShardyRelease

ROWS = {
    "ragged_free_dim": (
        "l = f32[16,32,64] parameter(0)\n  r = f32[4,16,64,8] parameter(1)\n  g = s32[16,4] parameter(2)\n  ROOT op = f32[16,32,8] ragged-dot(l, r, g), lhs_batch_dims={0}, rhs_batch_dims={1}, lhs_contracting_dims={2}, rhs_contracting_dims={2}, lhs_ragged_dims={1}, rhs_group_dims={0}",
        "#sdy.op_sharding_rule<([i, j, l], [m, i, l, k], [i, m])->([i, j, k]) {i=16, j=32, k=8, l=64, m=4} reduction={l} need_replication={j, m}>",
    ),
    "ragged_contracting_dim": (
        "l = f32[16,32,64] parameter(0)\n  r = f32[16,64,8] parameter(1)\n  g = s32[16,4] parameter(2)\n  ROOT op = f32[4,16,32,8] ragged-dot(l, r, g), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={1}, lhs_ragged_dims={2}",
        "#sdy.op_sharding_rule<([i, j, l], [i, l, k], [i, m])->([m, i, j, k]) {i=16, j=32, k=8, l=64, m=4} need_replication={l, m}>",
    ),
    "ragged_batch_dim": (
        "l = f32[16,32,64] parameter(0)\n  r = f32[16,64,8] parameter(1)\n  g = s32[4] parameter(2)\n  ROOT op = f32[16,32,8] ragged-dot(l, r, g), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={1}, lhs_ragged_dims={0}",
        "#sdy.op_sharding_rule<([i, j, l], [i, l, k], [m])->([i, j, k]) {i=16, j=32, k=8, l=64, m=1} reduction={l}>",
    ),
    "ragged_free_dim_many_dims": (
        "l = f32[41,21,11,42,22,12,43] parameter(0)\n  r = f32[41,11,31,42,32,12,43,7] parameter(1)\n  g = s32[11,12,21,7] parameter(2)\n  ROOT op = f32[11,12,21,22,31,32] ragged-dot(l, r, g), lhs_batch_dims={2,5}, rhs_batch_dims={1,5}, lhs_contracting_dims={0,3,6}, rhs_contracting_dims={0,3,6}, lhs_ragged_dims={4}, rhs_group_dims={7}",
        "#sdy.op_sharding_rule<([o, k, i, p, l, j, q], [o, i, m, p, n, j, q, r], [i, j, k, r])->([i, j, k, l, m, n]) {i=11, j=12, k=21, l=22, m=31, n=32, o=41, p=42, q=43, r=7} reduction={o, p, q} need_replication={l, r}>",
    ),
    "ragged_contracting_dim_many_dims": (
        "l = f32[41,21,11,42,22,12,43] parameter(0)\n  r = f32[41,11,31,42,32,12,43] parameter(1)\n  g = s32[11,12,41,7] parameter(2)\n  ROOT op = f32[7,11,12,21,22,31,32] ragged-dot(l, r, g), lhs_batch_dims={2,5}, rhs_batch_dims={1,5}, lhs_contracting_dims={0,3,6}, rhs_contracting_dims={0,3,6}, lhs_ragged_dims={3}",
        "#sdy.op_sharding_rule<([o, k, i, p, l, j, q], [o, i, m, p, n, j, q], [i, j, o, r])->([r, i, j, k, l, m, n]) {i=11, j=12, k=21, l=22, m=31, n=32, o=41, p=42, q=43, r=7} reduction={o, q} need_replication={p, r}>",
    ),
    "ragged_batch_dim_many_dims": (
        "l = f32[41,21,11,42,22,12,43] parameter(0)\n  r = f32[41,11,31,42,32,12,43] parameter(1)\n  g = s32[11,7] parameter(2)\n  ROOT op = f32[11,12,21,22,31,32] ragged-dot(l, r, g), lhs_batch_dims={2,5}, rhs_batch_dims={1,5}, lhs_contracting_dims={0,3,6}, rhs_contracting_dims={0,3,6}, lhs_ragged_dims={5}",
        "#sdy.op_sharding_rule<([o, k, i, p, l, j, q], [o, i, m, p, n, j, q], [r, s])->([i, j, k, l, m, n]) {i=11, j=12, k=21, l=22, m=31, n=32, o=41, p=42, q=43, r=1, s=1} reduction={o, p, q}>",
    ),
    "copy": (
        "x = f32[16,8] parameter(0)\n  ROOT op = f32[16,8] copy(x)",
        "#sdy.op_sharding_rule<([i, j])->([i, j]) {i=16, j=8}>",
    ),
}


@pytest.mark.parametrize("release", list(ShardyRelease), ids=lambda r: r.name.lower())
@pytest.mark.parametrize(("body", "expected"), list(ROWS.values()), ids=list(ROWS))
def test_rule_equals_xlas(body: str, expected: str, release: ShardyRelease) -> None:
    module = parse_hlo(f"HloModule m\n\nENTRY e {{\n  {body}\n}}\n")
    op = module.entry["op"]
    rule = sharding_rule(op, [module.entry[n].array_shape for n in op.operands], op.shape.leaves(), release=release)
    assert rule is not None and rule.to_text() == expected

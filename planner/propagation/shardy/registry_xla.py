"""XLA's own entries in Shardy's registry: the rules of the ops XLA's Shardy pass imports as `mhlo` ops.

StableHLO has no `copy` and no `ragged_dot`, so XLA's import writes HLO's as `mhlo.copy` and
`mhlo.ragged_dot`, whose rules XLA registers itself (`xla/service/spmd/shardy/extensions/`, checked by
its `mhlo_extensions_test.mlir`). Without them propagation would stop at every copy and at the grouped
matmuls of a mixture of experts.

Worked example, a ragged dot whose lhs rows are grouped (`lhs_ragged_dims` a free lhs dim; each group
of rows meets one of the rhs's `rhs_group_dims` slices): `ragged-dot(f32[16,32,64] lhs, f32[4,16,64,8]
rhs, s32[16,4] group_sizes)`, batch 0/1, contracting 2/2, lhs_ragged_dims={1}, rhs_group_dims={0}:
`([i, j, l], [m, i, l, k], [i, m])->([i, j, k]) {i=16, j=32, k=8, l=64, m=4} reduction={l}
need_replication={j, m}`: the grouped rows (j) and the groups (m) cannot be split, since which rows
meet which slice depends on the group sizes.
"""

from __future__ import annotations

from planner.propagation.shardy.registry_common import OpView, pointwise
from planner.propagation.shardy.rule import NULL_DIM, FactorType, OpShardingRule
from planner.propagation.shared.dot_dims import dot_dims


def copy(op: OpView) -> OpShardingRule | None:
    """`mhlo.copy`: pointwise."""
    return pointwise(op)


def ragged_dot(op: OpView) -> OpShardingRule | None:
    """Factors as a dot's (batch, lhs free, rhs free, contracting), then the group factor.

    The ragged dim decides the mode: a free lhs dim (the rhs has a group dim, the result none), a
    contracting dim (the result gains a leading group dim: one partial product per group), or a batch
    dim (the groups split the batch: nothing more to factor). The group sizes operand reads the batch
    factors, then the factors of the dims of the ragged dim's kind that come before it, then the groups;
    in batch mode its dims are factors of their own, of size 1 (it is never split).
    """
    if len(op.operands) != 3 or len(op.results) != 1:
        return None
    lhs, rhs, groups = op.operands
    (out,) = op.results
    (ragged,) = op.attr_dims("lhs_ragged_dims")
    dims = dot_dims(op.inst, len(lhs), len(rhs))
    lhs_contracting = [role.lhs for role in dims.contracting]
    lhs_batch = [role.lhs for role in dims.batch]
    mode = "contracting" if ragged in lhs_contracting else "batch" if ragged in lhs_batch else "free"
    shift = 1 if mode == "contracting" else 0  # the result's leading group dim
    builder = op.builder()
    batch_count = len(dims.batch)
    for k, role in enumerate(dims.batch):
        builder.add_factor([role.lhs, role.rhs, k if mode != "batch" else NULL_DIM], [shift + role.output],
                           lhs[role.lhs])  # fmt: skip
    # The group sizes' dims between the batch dims and the groups: the ragged dim's kind, before it.
    between = (
        [role.lhs for role in dims.lhs_non_contracting if role.lhs < ragged] if mode == "free"
        else [d for d in lhs_contracting if d < ragged] if mode == "contracting" else []
    )  # fmt: skip
    for role in dims.lhs_non_contracting:
        at = batch_count + between.index(role.lhs) if role.lhs in between else NULL_DIM
        kind = FactorType.NEED_REPLICATION if role.lhs == ragged else FactorType.PASS_THROUGH
        builder.add_factor([role.lhs, NULL_DIM, at], [shift + role.output], lhs[role.lhs], kind)
    # The rhs's group dims are no free dims of the result: its free dims follow the lhs's without them.
    rhs_free = [role.rhs for role in dims.rhs_non_contracting if role.rhs not in op.attr_dims("rhs_group_dims")]
    for k, d in enumerate(rhs_free):
        builder.add_factor([NULL_DIM, d, NULL_DIM], [shift + batch_count + len(dims.lhs_non_contracting) + k], rhs[d])
    for role in dims.contracting:
        at = batch_count + between.index(role.lhs) if role.lhs in between else NULL_DIM
        kind = FactorType.NEED_REPLICATION if role.lhs == ragged else FactorType.REDUCTION
        builder.add_factor([role.lhs, role.rhs, at], [NULL_DIM], lhs[role.lhs], kind)
    if mode == "free":
        (group_dim,) = op.attr_dims("rhs_group_dims")
        builder.add_factor([NULL_DIM, group_dim, len(groups) - 1], [NULL_DIM], rhs[group_dim],
                           FactorType.NEED_REPLICATION)  # fmt: skip
    elif mode == "contracting":
        builder.add_factor([NULL_DIM, NULL_DIM, len(groups) - 1], [0], out[0], FactorType.NEED_REPLICATION)
    else:
        for d in range(len(groups)):
            builder.add_factor([NULL_DIM, NULL_DIM, d], [NULL_DIM], 1)
    return builder.build()

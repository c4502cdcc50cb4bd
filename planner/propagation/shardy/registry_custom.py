"""Sharding rules of the custom calls Shardy knows, by call target.

A target Shardy does not know has no rule (it blocks propagation), as do the ones it refuses on
purpose: Python callbacks and TPU kernels run opaque code on whatever they are given. A custom call
that carries its own rule (`xla.sdy.sharding_rule`, as `custom_partitioning` writes) is read before
this table is consulted (`registry.sharding_rule`).
"""

from __future__ import annotations

from planner.propagation.shardy.registry_common import OpView, RuleFn, pointwise
from planner.propagation.shardy.registry_data import top_k
from planner.propagation.shardy.release import ShardyRelease
from planner.propagation.shardy.rule import NULL_DIM, FactorType, OpShardingRule

# Targets Shardy names only to give them no rule. `xla.debug.Log` is named since jaxlib 0.12; before, it
# was unknown, which gives no rule too.
_OPAQUE = frozenset(
    "sdy_testonly tpu_custom_call xla_python_cpu_callback xla_python_gpu_callback xla_ffi_python_cpu_callback "
    "xla_ffi_python_gpu_callback xla.debug.Log".split()
)

# Elementwise targets. `Sharding` is HLO's form of `sdy.sharding_constraint`, which Shardy lists with the
# pointwise ops. The `_SPMDInternalOp_` calls (since jaxlib 0.12) only permute data between partitions, so
# every result keeps the input's sharding.
_POINTWISE = frozenset(
    "annotate_device_placement Cholesky CompactWyHelper InspectSharding InvertDiagBlocksLowerTriangular "
    "InvertDiagBlocksUpperTriangular LayoutConstraint mhlo.erf MoveToDevice MoveToHost X64SplitHigh X64SplitLow "
    "xla.megascale.provide_metadata Sharding _SPMDInternalOp_MultiPad _SPMDInternalOp_MultiRotate "
    "_SPMDInternalOp_MultiSlice _SPMDInternalOp_RotateRight _SPMDInternalOp_Wrap".split()
)

# Not here on purpose: `SPMDFullToShardShape`/`SPMDShardToFullShape` (and Shardy's exported
# `xla.sdy.GlobalToLocalShape`/`LocalToGlobalShape`) bound a manual computation, which Shardy handles
# as a region of its own rather than by a rule; XLA's `TopK` target is unknown to Shardy.


def eigh(op: OpView) -> OpShardingRule | None:
    """`jax.lax.linalg.eigh`: results are the eigenvectors (the input's shape) and eigenvalues (one dim fewer).

    The two matrix dims correspond between input and eigenvectors, and the last one with the eigenvalues'
    own; propagating along them needs communication but is allowed.
    """
    if len(op.operands) != 1 or len(op.results) != 2:
        return None
    (shape,) = op.operands
    dim1, dim2 = len(shape) - 2, len(shape) - 1
    return (
        op.builder()
        .add_pointwise(shape[:-2])
        .add_factor([dim1], [dim1, NULL_DIM], shape[dim1])
        .add_factor([dim2], [dim2, dim1], shape[dim2])
        .build()
    )


def qr(op: OpView) -> OpShardingRule | None:
    """`jax.lax.linalg.qr`: the matrix dims of the input and the first result correspond but need replication;
    the second result's last dim (the smaller of the two) gets a factor of its own, as sharding it alike
    would not help the decomposition."""
    if len(op.operands) != 1 or len(op.results) != 2:
        return None
    (shape,) = op.operands
    taus = op.results[1]
    dim1, dim2 = len(shape) - 2, len(shape) - 1
    need = FactorType.NEED_REPLICATION
    return (
        op.builder()
        .add_pointwise(shape[:-2])
        .add_factor([dim1], [dim1, NULL_DIM], shape[dim1], need)
        .add_factor([dim2], [dim2, NULL_DIM], shape[dim2], need)
        .add_factor([NULL_DIM], [NULL_DIM, dim1], taus[dim1], need)
        .build()
    )


def householder_product(op: OpView) -> OpShardingRule | None:
    """`jax.lax.linalg.householder_product`: as QR's, with the taus an operand whose last dim is its own."""
    if len(op.operands) != 2 or len(op.results) != 1:
        return None
    shape, taus = op.operands
    dim1, dim2 = len(shape) - 2, len(shape) - 1
    need = FactorType.NEED_REPLICATION
    return (
        op.builder()
        .add_pointwise(shape[:-2])
        .add_factor([dim1, NULL_DIM], [dim1], shape[dim1], need)
        .add_factor([dim2, NULL_DIM], [dim2], shape[dim2], need)
        .add_factor([NULL_DIM, dim1], [NULL_DIM], taus[dim1], need)
        .build()
    )


def approx_top_k(op: OpView) -> OpShardingRule | None:
    """`jax.lax.approx_max_k`: operands are the array, its iota, and two scalar inits; results values, indices.

    A kept dim is shared by all. The reduced dim splits in two: the inputs' size (sharding it gives each
    device a partial top-k) and the results' size, which needs replication and is blocked.
    """
    if len(op.operands) != 4 or len(op.results) != 2:
        return None
    builder = op.builder()
    for dim, (in_size, out_size) in enumerate(zip(op.operands[0], op.results[0], strict=True)):
        if in_size == out_size:
            builder.add_factor_same_dim(dim, in_size)
        else:
            builder.add_factor([dim, dim, NULL_DIM, NULL_DIM], [NULL_DIM, NULL_DIM], in_size)
            builder.add_factor([NULL_DIM] * 4, [dim, dim], out_size, FactorType.NEED_REPLICATION, True)
    return builder.build()


def x64_combine(op: OpView) -> OpShardingRule:
    """Pointwise, but blocked when a rng-bit-generator reads the result.

    The generator's initial state must be replicated and no reshard may sit on the combined value, so a
    sharding of the two halves must not reach it; jaxlib 0.12's Shardy also marks the (one-dim) factor
    need-replication. Without the computation, users are unknown: not blocked.
    """
    if "rng-bit-generator" not in op.user_opcodes():
        return op.builder().add_pointwise(op.results[0]).build()
    kind = op.release.traits.x64_combine_seeding_rng
    return op.builder().add_pointwise(op.results[0], lambda _dim: kind, lambda _kind: True).build()


_BY_TARGET: dict[str, RuleFn] = {
    "Eigh": eigh,
    "Qr": qr,
    "QrDecompositionBlock": qr,
    "ProductOfElementaryHouseholderReflectors": householder_product,
    "mhlo.topk": top_k,
    "ApproxTopK": approx_top_k,
    "PartialReduce": approx_top_k,
    "X64Combine": x64_combine,
}


def custom_call(op: OpView) -> OpShardingRule | None:
    target = op.inst.attr("custom_call_target")
    if target in _OPAQUE or target in op.release.traits.unknown_targets:
        return None
    if target in _POINTWISE:
        return pointwise(op)
    rule = _BY_TARGET.get(target)
    return rule(op) if rule is not None else None


def no_rule_reason(target: str, release: ShardyRelease) -> str | None:
    if target in release.traits.unknown_targets:
        return f"custom call @{target} is unknown to {release.shardy}'s sharding rule registry"
    if target in _OPAQUE:
        return f"custom call @{target} runs opaque code: Shardy gives it no rule"
    if target in _POINTWISE or target in _BY_TARGET:
        return None
    return f"custom call @{target} is unknown to Shardy's sharding rule registry"

"""Sharding rules of ops that combine elements: dot, convolution, reductions, windows, batch norm, collectives.

Each entry follows its case in Shardy's `op_sharding_rule_registry.cc`, adding factors in the same
order: aggressive propagation breaks ties by factor index.
"""

from __future__ import annotations

from planner.propagation.shardy.registry_common import OpView, is_window_pass_through
from planner.propagation.shardy.rule import NULL_DIM, FactorType, OpShardingRule
from planner.propagation.shared.dot_dims import dot_dims, label_positions


def dot(op: OpView) -> OpShardingRule | None:
    """Batch dims, then lhs and rhs free dims (the result's dims in order), then the contracting pairs.

    A contracting factor is a reduction: sharding it leaves partial sums. StableHLO's plain `dot`
    (vector or matrix operands) becomes an HLO dot with dimension numbers, whose rule is the same.
    A dot with sparsity metadata operands has no StableHLO form, hence no rule.
    """
    if len(op.operands) != 2:
        return None
    lhs, rhs = op.operands
    dims = dot_dims(op.inst, len(lhs), len(rhs))
    builder = op.builder()
    for role in dims.batch:
        builder.add_factor([role.lhs, role.rhs], [role.output], lhs[role.lhs])
    for role in dims.lhs_non_contracting:
        builder.add_factor([role.lhs, NULL_DIM], [role.output], lhs[role.lhs])
    for role in dims.rhs_non_contracting:
        builder.add_factor([NULL_DIM, role.rhs], [role.output], rhs[role.rhs])
    for role in dims.contracting:
        builder.add_factor([role.lhs, role.rhs], [NULL_DIM], lhs[role.lhs], FactorType.REDUCTION)
    return builder.build()


def convolution(op: OpView) -> OpShardingRule:
    """Group counts, batch, spatial dims (outside conservative propagation), then features.

    An input spatial dim splits into the number of windows (shared with the output, a permutation: the
    windows overlap, so a halo moves between devices) and the window size (shared with the kernel, a
    reduction). The larger of the two goes major: a sharding of the input dim then reaches the tensor
    it fits best, or both when it is larger than the major factor. Each is capped by what is left of the
    input dim, and a factor of size 1 is left out.
    """
    lhs, rhs = op.operands
    (out,) = op.results
    labels = op.inst.attr("dim_labels")
    lhs_named, lhs_spatial = label_positions(labels.lhs)
    rhs_named, rhs_spatial = label_positions(labels.rhs)
    out_named, out_spatial = label_positions(labels.out)
    in_batch, in_feature = lhs_named["b"], lhs_named["f"]
    kernel_in, kernel_out = rhs_named["i"], rhs_named["o"]
    out_batch, out_feature = out_named["b"], out_named["f"]
    batch_groups = op.attr_int("batch_group_count", 1)
    feature_groups = op.attr_int("feature_group_count", 1)

    builder = op.builder()
    if batch_groups > 1:
        builder.add_factor([in_batch, kernel_out], [out_feature], batch_groups)
    builder.add_factor([in_batch, NULL_DIM], [out_batch], out[out_batch])

    if not op.conservative:
        for lhs_dim, rhs_dim, out_dim in zip(lhs_spatial, rhs_spatial, out_spatial, strict=True):
            num_windows, window_size = out[out_dim], rhs[rhs_dim]
            # (size, shared with the kernel?), the larger first.
            parts = [(num_windows, False), (window_size, True)]
            if num_windows < window_size:
                parts.reverse()
            remaining = lhs[lhs_dim]
            for size, contracting in parts:
                size = min(remaining, size)
                if size <= 1:
                    continue
                if contracting:
                    builder.add_factor([lhs_dim, rhs_dim], [NULL_DIM], size, FactorType.REDUCTION)
                else:
                    builder.add_factor([lhs_dim, NULL_DIM], [out_dim], size, FactorType.PERMUTATION)
                remaining //= size

    if feature_groups > 1:
        builder.add_factor([in_feature, kernel_out], [out_feature], feature_groups)
    builder.add_factor([in_feature, kernel_in], [NULL_DIM], rhs[kernel_in], FactorType.REDUCTION)
    out_feature_size = out[out_feature] // (batch_groups * feature_groups)
    if out_feature_size > 1:
        builder.add_factor([NULL_DIM, kernel_out], [out_feature], out_feature_size)
    return builder.build()


def reduce(op: OpView) -> OpShardingRule:
    """Each input dim is a factor of every input: a reduced one is a reduction, a kept one maps to its result
    dim. The init values are scalars."""
    num_inputs = len(op.results)
    reduced = op.attr_dims("dimensions")
    inits = [NULL_DIM] * num_inputs
    builder = op.builder()
    out_dim = 0
    for in_dim, size in enumerate(op.operands[0]):
        operand_dims = [in_dim] * num_inputs + inits
        if in_dim in reduced:
            builder.add_factor(operand_dims, [NULL_DIM] * num_inputs, size, FactorType.REDUCTION)
        else:
            builder.add_factor(operand_dims, [out_dim] * num_inputs, size)
            out_dim += 1
    return builder.build()


def reduce_window(op: OpView) -> OpShardingRule:
    """A result dim counts the windows along its input dim, which can be sharded along them.

    A dim whose window is one element with no stride or padding maps element to element (pass-through);
    any other needs data from neighbouring shards (a permutation, blocked when conservative).
    """
    window = op.inst.attr("window", ())
    return (
        op.builder()
        .add_pointwise(
            op.results[0],
            lambda dim: FactorType.PASS_THROUGH if is_window_pass_through(window, dim) else FactorType.PERMUTATION,
            lambda kind: op.conservative and kind is FactorType.PERMUTATION,
        )
        .build()
    )


def select_and_scatter(op: OpView) -> OpShardingRule:
    """A pass-through window dim is shared by operand, source and result.

    Any other dim splits in two: the source's dim (one element per window) needs replication, and the
    operand's dim maps to the result's as a permutation; both blocked when conservative.
    """
    window = op.inst.attr("window", ())
    source = op.operands[1]
    builder = op.builder()
    for dim, out_size in enumerate(op.results[0]):
        if is_window_pass_through(window, dim):
            builder.add_factor_same_dim(dim, out_size)
            continue
        builder.add_factor(
            [NULL_DIM, dim, NULL_DIM], [NULL_DIM], source[dim], FactorType.NEED_REPLICATION, op.conservative
        )
        builder.add_factor([dim, NULL_DIM, NULL_DIM], [dim], out_size, FactorType.PERMUTATION, op.conservative)
    return builder.build()


def batch_norm_inference(op: OpView) -> OpShardingRule:
    """Each operand dim is shared with the result; the feature dim also with the dim of the four per-feature
    operands (scale, offset, mean, variance), which normalize it element by element."""
    feature = int(op.word("feature_index", "0"))
    num_stats = len(op.operands) - 1
    builder = op.builder()
    for dim, size in enumerate(op.operands[0]):
        stats_dim = 0 if dim == feature else NULL_DIM
        builder.add_factor([dim, *[stats_dim] * num_stats], [dim], size)
    return builder.build()


def all_gather(op: OpView) -> OpShardingRule:
    """The gathered dim needs replication, with one factor for the operands' size and one for the results'."""
    (dim,) = op.attr_dims("dimensions")
    shape = op.operands[0]
    return (
        op.builder()
        .add_pointwise_if(shape, lambda d: d != dim)
        .add_factor_all_operands(dim, shape[dim], FactorType.NEED_REPLICATION)
        .add_factor_all_results(dim, op.results[0][dim], FactorType.NEED_REPLICATION)
        .build()
    )


def reduce_scatter(op: OpView) -> OpShardingRule:
    """As all-gather, with the scattered dim."""
    return all_gather(op)


def all_to_all(op: OpView) -> OpShardingRule | None:
    """As all-gather, with the dim that is split and concatenated.

    HLO's array all-to-all splits and concatenates one dim (`dimensions={d}`): Shardy's rule for a
    split dim equal to the concat dim (a different concat dim adds a second pair of factors, which HLO
    cannot ask for). Its tuple form (several operands, no `dimensions`) exchanges whole operands between
    devices, which no factor describes: no rule. jaxlib writes a multi-operand StableHLO all_to_all in
    that form.
    """
    if len(op.attr_dims("dimensions")) != 1:
        return None
    return all_gather(op)

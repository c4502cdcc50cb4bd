"""Sharding rules of ops that move, cut or reshape elements without combining them.

Each entry follows its case in Shardy's `op_sharding_rule_registry.cc`, adding factors in the same
order: aggressive propagation breaks ties by factor index.
"""

from __future__ import annotations

from math import gcd, prod

from planner.propagation.shardy.registry_common import OpView
from planner.propagation.shardy.rule import NULL_DIM, FactorType, OpShardingRule


def broadcast(op: OpView) -> OpShardingRule:
    """An output dim is either an operand dim carried over (one shared factor) or new (a factor of its own).

    HLO never expands a size-1 operand dim in place (jaxlib writes a reshape and a broadcast for it), but
    the rule keeps Shardy's branch for one: the operand dim gets a size-1 factor and the output dim a
    factor of its own, as for a new dim.
    """
    (in_shape,), (out_shape,) = op.operands, op.results
    out_to_in = [NULL_DIM] * len(out_shape)
    for in_dim, out_dim in enumerate(op.attr_dims("dimensions")):
        out_to_in[out_dim] = in_dim
    builder = op.builder()
    for out_dim, out_size in enumerate(out_shape):
        in_dim = out_to_in[out_dim]
        if in_dim != NULL_DIM and in_shape[in_dim] == 1 and out_size != 1:
            builder.add_factor([in_dim], [NULL_DIM], 1)
            in_dim = NULL_DIM
        builder.add_factor([in_dim], [out_dim], out_size)
    return builder.build()


def reshape(op: OpView) -> OpShardingRule | None:
    """Walk both shapes major to minor, splitting their dims into the largest factors they share.

    The walk keeps the product of the factors placed so far on each side. While the two products are
    equal, what is left of the current operand and result dims shares its gcd as one common factor. When
    the gcd is 1 the two pieces are swapped, not shared: jaxlib 0.7.1's Shardy gives each side its rest
    as a factor of its own; jaxlib 0.12's maps one permutation factor, the operand's rest, to both dims
    and counts the result's rest as placed, so the result dim's factors need not multiply to its size (a
    sharding carried across the swap moves data between devices). Once the products drift apart, the
    side behind takes a factor of its own that brings it level if one divides its dim, else one that
    keeps the next gcd for later; jaxlib 0.12 marks such one-sided factors, and those of size-1 dims,
    need-replication (`op.release.traits`).

    Worked example, `f32[6,4] -> f32[4,6]` under jaxlib 0.7.1: 6 and 4 share i=2; their rests, 3 and 2,
    share nothing, so the operand takes j=3 and the result k=2 (6 placed on the left, 4 on the right:
    both first dims done). The result, behind, takes l=3 of its 6, which leaves the gcd 2 of the rests 4
    and 2 intact; the operand, now behind at 6 against 12, takes m=2 to draw level; the last 2 is common
    (n): `([ij, mn])->([ik, ln]) {i=2, j=3, k=2, l=3, m=2, n=2}`. Under jaxlib 0.12 the swapped 3 and 2
    become one permutation factor j=3 on both first dims, the result's second dim takes k=3 alone, the
    operand's l=2, and m=2 is common: `([ij, lm])->([ij, km]) {i=2, j=3, k=3, l=2, m=2}
    need_replication={k, l} permutation={j}`.

    A reshape of zero elements has no rule: the walk cannot divide by a 0 dim, and nothing
    propagates through an empty array anyway.
    """
    (in_shape,), (out_shape,) = op.operands, op.results
    if prod(in_shape) == 0:
        return None
    traits = op.release.traits
    in_rank, out_rank = len(in_shape), len(out_shape)
    in_dim = out_dim = 0
    # Product of the dims started so far, and of the factors placed so far, on each side.
    in_dims_product = out_dims_product = 1
    in_factors_product = out_factors_product = 1
    builder = op.builder()
    while in_dim < in_rank or out_dim < out_rank:
        if in_dim < in_rank and in_shape[in_dim] == 1:
            builder.add_factor([in_dim], [NULL_DIM], 1, traits.reshape_size_one)
            in_dim += 1
            continue
        if out_dim < out_rank and out_shape[out_dim] == 1:
            builder.add_factor([NULL_DIM], [out_dim], 1, traits.reshape_size_one)
            out_dim += 1
            continue
        if in_dim < in_rank and in_dims_product == in_factors_product:
            in_dims_product *= in_shape[in_dim]
        if out_dim < out_rank and out_dims_product == out_factors_product:
            out_dims_product *= out_shape[out_dim]
        next_in = in_dims_product // in_factors_product
        next_out = out_dims_product // out_factors_product
        next_gcd = gcd(next_in, next_out)
        one_sided = traits.reshape_one_sided
        if in_factors_product == out_factors_product:
            if next_gcd > 1:
                builder.add_factor([in_dim], [out_dim], next_gcd)
                in_factors_product *= next_gcd
                out_factors_product *= next_gcd
            else:
                assert next_in > 1 and next_out > 1, (in_shape, out_shape)
                if traits.reshape_swapped is None:
                    builder.add_factor([in_dim], [NULL_DIM], next_in, one_sided)
                    builder.add_factor([NULL_DIM], [out_dim], next_out, one_sided)
                else:
                    builder.add_factor([in_dim], [out_dim], next_in, traits.reshape_swapped)
                in_factors_product *= next_in
                out_factors_product *= next_out
        elif in_factors_product < out_factors_product:
            next_in = _catch_up(next_in, in_factors_product, out_factors_product, next_gcd)
            builder.add_factor([in_dim], [NULL_DIM], next_in, one_sided)
            in_factors_product *= next_in
        else:
            next_out = _catch_up(next_out, out_factors_product, in_factors_product, next_gcd)
            builder.add_factor([NULL_DIM], [out_dim], next_out, one_sided)
            out_factors_product *= next_out

        if in_dim < in_rank and in_dims_product == in_factors_product:
            in_dim += 1
        if out_dim < out_rank and out_dims_product == out_factors_product:
            out_dim += 1
    return builder.build()


def _catch_up(next_factor: int, behind: int, ahead: int, next_gcd: int) -> int:
    """The factor the side whose placed product is `behind` takes next: one that draws it level with `ahead`
    if its dim's rest allows, else one that keeps the next gcd for later, else the whole rest."""
    if ahead % behind == 0 and next_factor % (ahead // behind) == 0:
        return ahead // behind
    if next_factor > next_gcd:
        return next_factor // next_gcd
    return next_factor


def transpose(op: OpView) -> OpShardingRule:
    (in_shape,) = op.operands
    builder = op.builder()
    for out_dim, in_dim in enumerate(op.attr_dims("dimensions")):
        builder.add_factor([in_dim], [out_dim], in_shape[in_dim])
    return builder.build()


def reverse(op: OpView) -> OpShardingRule:
    """A reversed dim keeps its sharding only by moving data between devices: a permutation factor."""
    reversed_dims = op.attr_dims("dimensions")
    return (
        op.builder()
        .add_pointwise(
            op.results[0],
            lambda dim: FactorType.PERMUTATION if dim in reversed_dims else FactorType.PASS_THROUGH,
        )
        .build()
    )


def slice_(op: OpView) -> OpShardingRule:
    """A sliced dim may stay sharded (the static offsets say how to shift the data), unless conservative.

    Unlike dynamic-slice, whose offsets are only known at run time.
    """
    return (
        op.builder()
        .add_pointwise_with_mismatch(op.operands[0], op.results[0], FactorType.PERMUTATION, op.conservative)
        .build()
    )


def pad(op: OpView) -> OpShardingRule:
    """A padded dim propagates as a permutation (it needs communication), unless conservative; the pad value
    is a scalar."""
    return (
        op.builder()
        .add_pointwise_with_mismatch(op.operands[0], op.results[0], FactorType.PERMUTATION, op.conservative)
        .build()
    )


def concatenate(op: OpView) -> OpShardingRule:
    """Every dim is shared; the concatenated one only outside conservative propagation.

    The concatenated dim is a permutation when the pieces are slices, or all come from the same array
    (each sliced or whole: `concat(slice(x), x, slice(x))`), since a permutation of the data rebuilds it;
    otherwise it needs replication. jaxlib 0.12's Shardy (shardy@77965a29) asks the same-array pattern for
    at least one slice: a concatenate of whole copies, `concat(x, x, x)`, needs replication.
    """
    (dim,) = op.attr_dims("dimensions")
    kind = _concat_dim_kind(op)
    return (
        op.builder()
        .add_pointwise_if(
            op.results[0],
            lambda d: not op.conservative or d != dim,
            lambda d: kind if d == dim else FactorType.PASS_THROUGH,
        )
        .build()
    )


def _concat_dim_kind(op: OpView) -> FactorType:
    producers = [op.producer(i) for i in range(len(op.operands))]
    sliced = [p is not None and p.opcode == "slice" for p in producers]
    if all(sliced):
        return FactorType.PERMUTATION
    before_slice = [
        p.operands[0] if p is not None and is_slice else name
        for p, is_slice, name in zip(producers, sliced, op.inst.operands, strict=True)
    ]
    same_array = all(name == before_slice[0] for name in before_slice)
    if same_array and (any(sliced) or not op.release.traits.concatenate_same_array_needs_slice):
        return FactorType.PERMUTATION
    return FactorType.NEED_REPLICATION


def dynamic_slice(op: OpView) -> OpShardingRule:
    """A sliced dim needs replication and blocks propagation, whatever the mode: its offset is only known at
    run time, so no device can tell which part of the window it holds. The offsets are scalars."""
    return (
        op.builder()
        .add_pointwise_with_mismatch(op.operands[0], op.results[0], FactorType.NEED_REPLICATION, True)
        .build()
    )


def dynamic_update_slice(op: OpView) -> OpShardingRule:
    """A dim the update covers whole is shared by operand, update and result.

    For a dim the update covers in part, operand and result share a factor, and the update's dim gets one
    of its own. jaxlib 0.7.1's Shardy keeps the first pass-through and makes the second need replication:
    the partitioner replicates the update and each device writes its own shard with its local offsets.
    jaxlib 0.12's marks both permutations: the dim may stay sharded, at the cost of moving data.
    """
    operand_shape, update_shape = op.operands[0], op.operands[1]
    others = [NULL_DIM] * (len(op.operands) - 2)
    operand_kind, update_kind = op.release.traits.dynamic_update_slice_window
    builder = op.builder()
    for dim, (operand_size, update_size) in enumerate(zip(operand_shape, update_shape, strict=True)):
        if operand_size == update_size:
            builder.add_factor_same_dim(dim, operand_size)
        else:
            builder.add_factor([dim, NULL_DIM, *others], [dim], operand_size, operand_kind)
            builder.add_factor([NULL_DIM, dim, *others], [NULL_DIM], update_size, update_kind)
    return builder.build()


def bitcast_convert(op: OpView) -> OpShardingRule:
    """Every dim but the extra minor one of the narrower element type may be sharded."""
    (in_shape,), (out_shape,) = op.operands, op.results
    shape = in_shape if len(in_shape) < len(out_shape) else out_shape
    builder = op.builder().add_pointwise(shape)
    if len(in_shape) < len(out_shape):
        builder.add_factor([NULL_DIM], [len(out_shape) - 1], out_shape[-1], FactorType.NEED_REPLICATION)
    elif len(in_shape) > len(out_shape):
        builder.add_factor([len(in_shape) - 1], [NULL_DIM], in_shape[-1], FactorType.NEED_REPLICATION)
    return builder.build()


def select(op: OpView) -> OpShardingRule:
    """Pointwise over the result; a scalar predicate is broadcast, so it takes no factor."""
    return op.builder().add_pointwise(op.results[0]).build()


def clamp(op: OpView) -> OpShardingRule:
    """Pointwise over the clamped operand; scalar bounds take no factor."""
    return op.builder().add_pointwise(op.operands[1]).build()

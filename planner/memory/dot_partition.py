"""How the SPMD partitioner computes a dot: what each device holds of its operands and its result.

Every mesh axis that splits a dot plays one role. It splits a contracting dim of both operands
(each device multiplies its slices; the result holds partial sums, reduced afterwards), or a batch
or free dim that the result keeps. An operand split along an axis the dot does not use that way is
gathered along it first (FSDP's weight all-gather).

Axes are recognised by the device groups they make: a dim split four ways over `fsdp` of a 4x2 mesh
puts devices {0,1}, {2,3}, {4,5}, {6,7} in its four tiles, whatever the sharding's other dims do,
and any dim split over `fsdp` groups them the same way.

Worked example, the backward dot dx[b,s,D] = dy[b,s,F] . W[D,F] of an FSDP x TP step on 4x2:
dy is split b/fsdp and F/tp, W is split D/fsdp and F/tp, dx is wanted b/fsdp and D/tp.
tp splits the contracting F on both sides: it stays, and dx comes out as partial sums. fsdp splits
dy's b as dx wants it: it stays. W's D is split over fsdp, which dx uses on b, and dx wants D over
tp, which is taken by the contraction: W is gathered to full D. Each device holds W[D, F/2] and
computes dx[b/4, s, D] of partial sums, then reduces and scatters it to dx[b/4, s, D/2].
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from planner.hlo.ir.shapes import ArrayShape
from planner.propagation import DotDims
from planner.sharding.hlo_sharding import HloSharding

Grouping = frozenset[frozenset[int]]


@functools.lru_cache(maxsize=65536)
def axis_grouping(sharding: HloSharding | None, dim: int) -> Grouping | None:
    """The devices of each tile along `dim`, or None when the dim is not split."""
    if sharding is None or not sharding.is_tiled or dim >= sharding.tiled_data_rank:
        return None
    tiles = sharding.tile_assignment
    assert tiles is not None
    if tiles.dims[dim] == 1:
        return None
    devices = tiles.array()
    return frozenset(frozenset(np.take(devices, i, axis=dim).reshape(-1).tolist()) for i in range(tiles.dims[dim]))


def _split(sharding: HloSharding | None, dim: int) -> int:
    if sharding is None or not sharding.is_tiled or dim >= sharding.tiled_data_rank:
        return 1
    return sharding.data_tile_dims[dim]


@dataclass(frozen=True)
class DotPartition:
    operand_bytes: tuple[int, int]  # per device, as the dot reads them
    result_bytes: int  # per device, as the dot writes it
    partial: bool  # the result holds partial sums over a split contracting dim
    # The device groupings each operand is gathered over, and those its contraction reduces over.
    gathered_over: tuple[frozenset[Grouping], frozenset[Grouping]] = (frozenset(), frozenset())
    reduced_over: frozenset[Grouping] = frozenset()
    flops: int = 0  # per device: 2 x result elements x contracted elements, as the partition computes them
    # The per-device shapes behind `operand_bytes` and `result_bytes`.
    operand_shard_shapes: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
    result_shard_shape: tuple[int, ...] = ()


def partition_dot(
    dims: DotDims,
    shapes: tuple[ArrayShape, ArrayShape, ArrayShape],
    shardings: tuple[HloSharding | None, HloSharding | None, HloSharding | None],
) -> DotPartition:
    """Per-device operand and result bytes of a dot, `shapes` and `shardings` as (lhs, rhs, output)."""
    lhs, rhs, out = shardings
    contracting: set[Grouping] = set()
    for role in dims.contracting:
        g = axis_grouping(lhs, role.lhs)
        if g is not None and g == axis_grouping(rhs, role.rhs):
            contracting.add(g)
    splits: list[list[int]] = [[1] * shapes[0].rank, [1] * shapes[1].rank]
    result = [1] * shapes[2].rank
    for k, (side, sharding) in enumerate((("lhs", lhs), ("rhs", rhs))):
        for role in dims.contracting:
            d = getattr(role, side)
            if axis_grouping(sharding, d) in contracting:
                splits[k][d] = _split(sharding, d)
        used = set(contracting)
        roles = list(dims.batch) + list(dims.lhs_non_contracting if side == "lhs" else dims.rhs_non_contracting)
        for role in roles:
            d, o = getattr(role, side), role.output
            own, wanted = axis_grouping(sharding, d), axis_grouping(out, o)
            if own is not None and own == wanted:
                splits[k][d] = _split(sharding, d)
            elif wanted is not None and wanted not in used:
                splits[k][d] = _split(out, o)
            else:
                continue
            used.add(axis_grouping(sharding, d) if own == wanted else wanted)  # type: ignore[arg-type]
            result[o] = max(result[o], splits[k][d])
    operand_shard_shapes = tuple(
        tuple(-(-n // t) for n, t in zip(shape.dims, split)) for shape, split in zip(shapes[:2], splits)
    )
    operand_bytes = tuple(shape.bytes_for_dims(dims) for shape, dims in zip(shapes[:2], operand_shard_shapes))
    out_shape = shapes[2]
    result_shard_shape = tuple(-(-n // t) for n, t in zip(out_shape.dims, result))
    result_bytes = out_shape.bytes_for_dims(result_shard_shape)
    gathered = tuple(
        frozenset(
            g
            for d in range(shape.rank)
            if split[d] < _split(sharding, d) and (g := axis_grouping(sharding, d)) is not None
        )
        for shape, split, sharding in zip(shapes[:2], splits, (lhs, rhs))
    )
    result_elements = 1
    for n, t in zip(out_shape.dims, result):
        result_elements *= -(-n // t)
    contracted = 1
    for role in dims.contracting:
        contracted *= -(-shapes[0].dims[role.lhs] // splits[0][role.lhs])
    return DotPartition(
        (operand_bytes[0], operand_bytes[1]),
        result_bytes,
        bool(contracting),
        (gathered[0], gathered[1]),
        frozenset(contracting),
        2 * result_elements * contracted,
        (operand_shard_shapes[0], operand_shard_shapes[1]),
        result_shard_shape,
    )

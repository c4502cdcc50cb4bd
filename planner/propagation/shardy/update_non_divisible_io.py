"""Shardy's `sdy-update-non-divisible-input-output-shardings`: the function's arguments and results sharded
only by axes that divide their dims.

An argument or result dim of 6 sharded `{"a", "b"}` on `["a"=2, "b"=2]` keeps `"a"` (2 divides 6) and drops
`"b"` (4 does not); where an axis divides only in part, the part that does is kept as a sub-axis
(`"b":(1)2` of a `"b"=4`). Inside the function a dim may be padded; at its boundary the partitioner
needs even shards.
"""

from __future__ import annotations

import math
from dataclasses import replace

from planner.propagation.shardy import axes as ax
from planner.propagation.shardy.program import Program
from planner.sharding.shardy import AxisRef, DimSharding, SdyMesh, TensorSharding


def update_non_divisible_io(program: Program) -> None:
    for value in program.args:
        if value.sharding is not None and value.dims is not None:
            value.sharding = _evenly_sharded(value.sharding, value.dims, program.mesh_of(value.sharding))
    for result in program.results:
        if result.sharding is not None and result.value.dims is not None:
            result.sharding = _evenly_sharded(result.sharding, result.value.dims, program.mesh_of(result.sharding))


def _evenly_sharded(s: TensorSharding, dims: tuple[int, ...], mesh: SdyMesh) -> TensorSharding:
    out = []
    for dim, size in zip(s.dims, dims, strict=False):
        if size % ax.total_size(dim.axes, mesh) == 0:
            out.append(dim)
            continue
        left = size
        kept: list[AxisRef] = []
        for ref in dim.axes:
            gcd = math.gcd(ax.size_of(ref, mesh), left)
            if gcd == 1:
                break
            if ax.size_of(ref, mesh) == gcd:
                kept.append(ref)
                left //= gcd
            else:
                kept.append(AxisRef(ref.name, ax.pre_size(ref), gcd))
                break
        out.append(DimSharding(tuple(kept), dim.is_open))
    return replace(s, dims=tuple(out))

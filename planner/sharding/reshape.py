"""Shardings through reshapes (XLA's ReshapeSharding and PropagateShardingThroughReshape).

Worked example: f32[8,1024] sharded [4,2] reshaped to f32[8,32,32]: dim 0
passes its 4 tiles unchanged; dim 1 (1024 in 2 tiles) splits into 32x32 and
its 2 tiles go to the major part, giving [4,2,1]. A factor that cannot be
placed (a sharded minor dim of a merge) becomes replication instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

from planner.sharding.algebra import (
    merge_if_compatible,
    partially_replicate_on_dims,
    replication_dim,
    subgroup_dims,
    total_num_tiles,
)
from planner.sharding.hlo_sharding import HloSharding
from planner.sharding.tile_assignment import TileAssignment


def reshape_sharding(source: Sequence[int], target: Sequence[int], s: HloSharding) -> HloSharding | None:
    """ReshapeSharding: walks source and target dims major to minor.

    Returns None when no sharded factor reaches the target or a split/merge
    is uneven.
    """
    if not s.is_tiled:
        return s
    assert s.tile_assignment is not None
    tiles = s.tile_assignment.dims
    srank, trank = len(source), len(target)
    target_tiles = [1] * trank
    to_replicate: list[int] = []
    si = ti = 0
    if srank == 0 or trank == 0:
        return None
    s_size, s_tile, t_size = source[0], tiles[0], target[0]

    def advance_source() -> bool:
        nonlocal si, s_size, s_tile
        si += 1
        if si == srank:
            return False
        s_size, s_tile = source[si], tiles[si]
        return True

    def advance_target() -> bool:
        nonlocal ti, t_size
        ti += 1
        if ti == trank:
            return False
        t_size = target[ti]
        return True

    while si < srank and ti < trank:
        product = 1
        while s_tile == 1:
            product *= s_size
            if not advance_source():
                break
        while product != 1 and product % t_size == 0:
            product //= t_size
            if not advance_target():
                break
        if si == srank or ti == trank or product != 1:
            break
        if s_size == t_size:
            if t_size != target[ti] and s_size % s_tile != 0:
                target_tiles[ti] *= math.gcd(s_size, s_tile)
                break
            target_tiles[ti] *= s_tile
            advance_source()
            advance_target()
        elif t_size == 1:
            advance_target()
        elif s_size == 1:
            if s_tile > 1:
                to_replicate.append(si)
            advance_source()
        elif s_size % s_tile != 0:
            return None
        else:
            g = math.gcd(s_tile, t_size)
            if g == 1:
                break
            s_size //= g
            s_tile //= g
            t_size //= g
            target_tiles[ti] *= g
    if math.prod(target_tiles) == 1:
        return None
    sh = partially_replicate_on_dims(s, to_replicate)
    if not sh.is_tiled:
        return None
    assert sh.tile_assignment is not None
    rep_dim = replication_dim(sh)
    for i in range(sh.tiled_data_rank, sh.tile_assignment.rank):
        target_tiles.append(1 if i == rep_dim else sh.tile_assignment.dims[i])
    types = list(sh.subgroup_types)
    extra = total_num_tiles(sh) // math.prod(target_tiles)
    if extra > 1:
        if sh.replicate_on_last_tile_dim:
            target_tiles[-1] = extra
            types.append("replicated")
        elif "replicated" in types:
            target_tiles[rep_dim - sh.tiled_data_rank + trank] = extra
        else:
            target_tiles.append(extra)
            types.append("replicated")
    return HloSharding.subgroup(sh.tile_assignment.reshape(tuple(target_tiles)), tuple(types), sh.metadata)


def propagate_through_reshape(source: Sequence[int], target: Sequence[int], s: HloSharding) -> HloSharding:
    """PropagateShardingThroughReshape: best effort, never fails (worst case replicated).

    Tries the longest runs of consecutive source dims first and combines what
    each run contributes.
    """
    return _through_reshape(tuple(source), tuple(target), s)


# A pure function of hashable values that propagation asks again and again.
@lru_cache(maxsize=65536)
def _through_reshape(source: tuple[int, ...], target: tuple[int, ...], s: HloSharding) -> HloSharding:
    if not s.is_tiled:
        return s
    assert s.tile_assignment is not None
    if "manual" in s.subgroup_types:
        return _through_reshape_with_manual(source, target, s)
    tiles = s.tile_assignment
    srank, trank = len(source), len(target)
    result = HloSharding.replicate()
    start = 0
    while start < srank:
        found = False
        for end in range(srank, start, -1):
            probe_dims = tuple(tiles.dims[i] if start <= i < end else 1 for i in range(srank))
            if math.prod(probe_dims) == 1:
                continue
            reshaped = reshape_sharding(source, target, HloSharding.tile(TileAssignment.from_iota(probe_dims)))
            if reshaped is None or not reshaped.is_tiled:
                continue
            assert reshaped.tile_assignment is not None
            perm = [*range(start, end), *range(0, start), *range(end, tiles.rank)]
            dims = list(reshaped.tile_assignment.dims)
            rep = tiles.num_devices // math.prod(dims)
            if len(dims) == trank:
                dims.append(rep)
            else:
                dims[-1] *= rep
            candidate = HloSharding.partial_tile(tiles.transpose(tuple(perm)).reshape(tuple(dims)))
            merged = merge_if_compatible(candidate, result)
            if merged is not None:
                result = merged
                start = end
                found = True
                break
        if not found:
            start += 1
    return result.with_metadata(s.metadata)


def _through_reshape_with_manual(source: Sequence[int], target: Sequence[int], s: HloSharding) -> HloSharding:
    """Manual subgroups ride along: reshape the rest, keep the manual dim."""
    assert s.tile_assignment is not None
    # View the sharding without its manual dim (as a partial tile over the
    # other devices of each manual group), reshape, then put it back.
    rank = s.tiled_data_rank
    m = rank + s.subgroup_types.index("manual")
    tiles = s.tile_assignment
    others = [d for d in range(tiles.rank) if d != m]
    moved = tiles.transpose((m, *others))
    manual_size = tiles.dims[m]
    inner_dims = tuple(tiles.dims[d] for d in others)
    rep = math.prod(inner_dims[rank:])
    probe_dims = (*inner_dims[:rank], rep) if rep > 1 else inner_dims[:rank]
    probe = (
        HloSharding.partial_tile(TileAssignment.from_iota(probe_dims))
        if rep > 1
        else HloSharding.tile(TileAssignment.from_iota(probe_dims))
    )
    inner = propagate_through_reshape(source, target, probe)
    group_size = tiles.num_devices // manual_size
    groups = moved.array().reshape(manual_size, group_size)
    if inner.is_tiled:
        assert inner.tile_assignment is not None
        inner_array = inner.tile_assignment.array()
        inner_rank = inner.tiled_data_rank
        inner_rep = inner_array.shape[inner_rank:] if inner.replicate_on_last_tile_dim else ()
        data = inner_array.shape[:inner_rank]
    else:
        data = (1,) * len(target)
        inner_rep = (group_size,)
        inner_array = None
    import numpy as np

    out = np.zeros((*data, manual_size, *inner_rep), dtype=np.int64)
    positions = np.arange(group_size).reshape(*data, *inner_rep) if inner_array is None else inner_array
    for g in range(manual_size):
        index: tuple[slice | int, ...] = (*(slice(None),) * len(data), g)
        out[index] = groups[g][positions]
    types = ("manual", "replicated") if inner_rep and math.prod(inner_rep) > 1 else ("manual",)
    dims = (*data, manual_size, *inner_rep) if inner_rep and math.prod(inner_rep) > 1 else (*data, manual_size)
    return HloSharding.subgroup(TileAssignment.from_devices(out.reshape(-1).tolist(), dims), types, s.metadata)


__all__ = ["propagate_through_reshape", "reshape_sharding", "subgroup_dims"]

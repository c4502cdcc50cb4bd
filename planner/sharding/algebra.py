"""Sharding algebra: the operations propagation applies to shardings.

These follow XLA's `hlo_sharding_util` (names in each docstring). A sharding
here is always a leaf (`HloSharding` that is not a tuple) unless said
otherwise. Worked example of the most used one: partially replicating dim 1 of
`{devices=[2,4]<=[8]}` (dim 0 in 2, dim 1 in 4 tiles) moves dim 1's four
devices per row into a replication group: `{devices=[2,1,4]<=[8]
last_tile_dim_replicate}` (devices 0-3 hold rows 0-3, 4-7 rows 4-7).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from planner.sharding.hlo_sharding import HloSharding, Kind
from planner.sharding.tile_assignment import TileAssignment


def _tiles(s: HloSharding) -> TileAssignment:
    assert s.tile_assignment is not None, f"{s} is not tiled"
    return s.tile_assignment


def _rebuild(s: HloSharding, tiles: TileAssignment) -> HloSharding:
    """Same replication form as `s`, new tile assignment, canonicalised."""
    if s.replicate_on_last_tile_dim:
        return HloSharding.partial_tile(tiles, s.metadata)
    return HloSharding.subgroup(tiles, s.subgroup_types, s.metadata)


def reshape_tiles(s: HloSharding, dims: Sequence[int]) -> HloSharding:
    """`s`'s devices in the same order, tiled as `dims` (data dims, then `s`'s subgroup dims), with
    `s`'s replication form: how a sharding follows a shape that gains or loses size-1 dims."""
    return _rebuild(s, _tiles(s).reshape(tuple(dims)))


def subgroup_dims(s: HloSharding) -> tuple[int, ...]:
    """Tile dims after the data dims (replication and typed subgroups)."""
    return _tiles(s).dims[s.tiled_data_rank :]


def replication_dim(s: HloSharding) -> int:
    """SubgroupReplicationDim: the tile dim holding replicas, or -1."""
    if "replicated" in s.subgroup_types:
        return s.tiled_data_rank + s.subgroup_types.index("replicated")
    return _tiles(s).rank - 1 if s.replicate_on_last_tile_dim else -1


def manual_dim(s: HloSharding) -> int:
    if "manual" in s.subgroup_types:
        return s.tiled_data_rank + s.subgroup_types.index("manual")
    return -1


def total_num_tiles(s: HloSharding) -> int:
    return _tiles(s).num_devices if s.is_tiled else 1


# -- replication -----------------------------------------------------------


def partially_replicate_on_dims(s: HloSharding, dims: Sequence[int]) -> HloSharding:
    """PartiallyReplicateTiledShardingOnDims: tiles of `dims` become replicas."""
    if not s.is_tiled:
        return s
    return _partially_replicate(s, tuple(sorted(set(dims))))


@lru_cache(maxsize=65536)
def _partially_replicate(s: HloSharding, dims: tuple[int, ...]) -> HloSharding:
    rank = s.tiled_data_rank
    replicated = sorted({d for d in dims if d < rank})
    tiles = _tiles(s)
    group = math.prod(tiles.dims[d] for d in replicated)
    if group == 1:
        return s
    if group == s.num_tiles and not s.subgroup_types:
        return HloSharding.replicate(s.metadata)
    perm = [d for d in range(rank) if d not in replicated] + replicated
    moved = transpose_sharding(s, perm).tile_assignment
    assert moved is not None
    shape = list(tiles.dims)
    for d in replicated:
        shape[d] = 1
    if s.replicate_on_last_tile_dim:
        shape[-1] *= group
        return HloSharding.partial_tile(moved.reshape(tuple(shape)), s.metadata)
    shape.insert(rank, group)
    return HloSharding.subgroup(moved.reshape(tuple(shape)), ("replicated", *s.subgroup_types), s.metadata)


def partially_replicate_all_except(s: HloSharding, keep: Sequence[int]) -> HloSharding:
    """PartiallyReplicateTiledShardingOnAllDimsExcept."""
    if not s.is_tiled:
        return s
    return partially_replicate_on_dims(s, [d for d in range(s.tiled_data_rank) if d not in keep])


def replicate_all_data_dims(s: HloSharding, data_rank: int = -1) -> HloSharding:
    """ReplicateAllDataDims: replicated, but manual subgroups survive."""
    if s.kind is Kind.MANUAL:
        return s
    if not s.subgroup_types:
        return HloSharding.replicate(s.metadata)
    r = partially_replicate_all_except(s, ())
    if data_rank >= 0 and r.is_tiled and data_rank != r.tiled_data_rank:
        dims = (1,) * data_rank + subgroup_dims(r)
        r = HloSharding.subgroup(_tiles(r).reshape(dims), r.subgroup_types)
    return r


def remove_dims(s: HloSharding, dims: Sequence[int]) -> HloSharding:
    """RemoveShapeDimensions: drops tile dims that are 1."""
    if not s.is_tiled or not dims:
        return s
    tiles = _tiles(s)
    assert all(tiles.dims[d] == 1 for d in dims), f"removing sharded dims {dims} of {s}"
    kept = tuple(n for i, n in enumerate(tiles.dims) if i not in set(dims))
    return reshape_tiles(s, kept)


def add_dims(s: HloSharding, at: int, count: int) -> HloSharding:
    """AddShapeDimensions: `count` unsharded dims inserted at data dim `at`."""
    if not s.is_tiled or count == 0:
        return s
    dims = list(_tiles(s).dims)
    dims[at:at] = [1] * count
    return reshape_tiles(s, dims)


# -- permutations ------------------------------------------------------------


def transpose_sharding(s: HloSharding, dimensions: Sequence[int]) -> HloSharding:
    """TransposeSharding: result dim i is `s`'s dim dimensions[i]."""
    if not s.is_tiled:
        return s
    tiles = _tiles(s)
    rank = s.tiled_data_rank
    perm = list(dimensions)
    if len(perm) == rank:
        perm += range(rank, tiles.rank)
    assert len(perm) == tiles.rank, f"transpose {dimensions} does not fit {s}"
    moved = tiles.transpose(tuple(perm))
    if s.replicate_on_last_tile_dim:
        return HloSharding.partial_tile(moved, s.metadata)
    types = tuple(s.subgroup_types[perm[i] - rank] for i in range(rank, len(perm)))
    return HloSharding.subgroup(moved, types, s.metadata)


def reverse_sharding(s: HloSharding, dims: Sequence[int]) -> HloSharding:
    """ReverseSharding: the tile order flips along `dims`."""
    if not s.is_tiled or not dims:
        return s
    array = np.flip(_tiles(s).array(), axis=tuple(dims))
    return _rebuild(s, TileAssignment.from_devices(array))


def transpose_with_collapsed_dims(
    s: HloSharding, src_to_tgt: Sequence[int], tgt_to_src: Sequence[int]
) -> HloSharding | None:
    """TransposeShardingWithCollapsedDims: a transpose that may drop or add dims.

    -1 marks a dim without counterpart. None when a dropped dim is sharded.
    """
    if not s.is_tiled:
        return s
    tiles = _tiles(s)
    rank = s.tiled_data_rank
    for i, t in enumerate(src_to_tgt):
        if t < 0 and i < rank and tiles.dims[i] > 1:
            return None
    perm = [src for src in tgt_to_src if src >= 0]
    perm += [i for i, t in enumerate(src_to_tgt) if t < 0]
    perm += range(rank, tiles.rank)
    moved = tiles.transpose(tuple(perm))
    target = [tiles.dims[src] if src >= 0 else 1 for src in tgt_to_src] + list(tiles.dims[rank:])
    return _rebuild(s, moved.reshape(tuple(target)))


def propagate_along_dims(
    s: HloSharding, source_dims: Sequence[int], target_dims: Sequence[int], target_rank: int
) -> HloSharding:
    """PropagateShardingAlongDimsAndReplicateOthers."""
    if not s.is_tiled:
        return s
    r = partially_replicate_all_except(s, source_dims)
    if not r.is_tiled:
        return r
    order_s = sorted(range(len(source_dims)), key=lambda i: source_dims[i])
    order_t = sorted(range(len(target_dims)), key=lambda i: target_dims[i])
    if order_s != order_t:
        perm = [source_dims[j] for j in order_t]
        perm += [d for d in range(_tiles(r).rank) if d not in source_dims]
        r = transpose_sharding(r, perm)
    dims = [1] * target_rank
    for src, tgt in zip(source_dims, target_dims):
        dims[tgt] = _tiles(s).dims[src]
    dims += subgroup_dims(r)
    return reshape_tiles(r, dims)


# -- per-device group views used by merging and sub-tiling -------------------


def _device_tiles(s: HloSharding) -> dict[int, tuple[int, ...]]:
    """Device -> its data tile index (replicas share one)."""
    array = _tiles(s).array()
    rank = s.tiled_data_rank
    out: dict[int, tuple[int, ...]] = {}
    for index, device in np.ndenumerate(array):
        out[int(device)] = tuple(int(i) for i in index[:rank])
    return out


@lru_cache(maxsize=65536)
def merge_if_compatible(to_merge: HloSharding, dst: HloSharding, min_tiles: int | None = None) -> HloSharding | None:
    """MergeShardingIfCompatible: `dst` refined by `to_merge`, or None.

    Two partial shardings combine when, per data dim, they agree or one is
    unsharded; each merged tile is held by the devices both agree on.
    Worked example: [2,1,2] replicate (rows {0,1},{2,3}) with [1,2,2]
    replicate (cols {0,2},{1,3}) gives [2,2] 0,1,2,3.
    """
    if min_tiles is None:
        min_tiles = dst.num_tiles + 1
    if to_merge.is_tile_maximal:
        return None
    if dst.is_tile_maximal:
        return to_merge
    if not (to_merge.is_tiled and dst.is_tiled) or not dst.has_partial_replication:
        return None
    rank = dst.tiled_data_rank
    if to_merge.tiled_data_rank != rank:
        return None
    mm, dm = manual_dim(to_merge), manual_dim(dst)
    if (mm >= 0) != (dm >= 0):
        return None
    a_dims, b_dims = _tiles(to_merge).dims, _tiles(dst).dims
    merged: list[int] = []
    for i in range(rank):
        a, b = a_dims[i], b_dims[i]
        if a == b or b == 1:
            merged.append(a)
        elif a == 1:
            merged.append(b)
        else:
            return None
    num_devices = _tiles(to_merge).num_devices
    if num_devices != _tiles(dst).num_devices:
        return None
    new_tiles = math.prod(merged)
    if num_devices % new_tiles or new_tiles < min_tiles:
        return None
    manual_size = 1
    if mm >= 0:
        manual_size = a_dims[mm]
        if manual_size != b_dims[dm] or num_devices % (new_tiles * manual_size):
            return None
    replication = num_devices // (new_tiles * manual_size)

    def groups(s: HloSharding) -> dict[tuple[int, ...], set[int]]:
        # (data index, manual index) -> devices holding that tile.
        array = _tiles(s).array()
        md = manual_dim(s)
        out: dict[tuple[int, ...], set[int]] = {}
        for index, device in np.ndenumerate(array):
            key = tuple(int(i) for i in index[:rank]) + ((int(index[md]),) if md >= 0 else ())
            out.setdefault(key, set()).add(int(device))
        return out

    ga, gb = groups(to_merge), groups(dst)
    cells = [*merged, manual_size] if mm >= 0 else merged
    devices: list[int] = []
    used: set[int] = set()
    for index in np.ndindex(*cells):
        data = index[:rank]
        key_a = tuple(t if a_dims[d] > 1 else 0 for d, t in enumerate(data)) + index[rank:]
        key_b = tuple(t if b_dims[d] > 1 else 0 for d, t in enumerate(data)) + index[rank:]
        common = sorted((ga.get(key_a, set()) & gb.get(key_b, set())) - used)
        if len(common) < replication:
            return None
        chosen = common[:replication]
        used.update(chosen)
        devices.extend(chosen)
    tile_dims = list(cells) + ([replication] if replication > 1 else [])
    types = (("manual",) if mm >= 0 else ()) + (("replicated",) if replication > 1 else ())
    metadata = dst.metadata + tuple(m for m in to_merge.metadata if m not in dst.metadata)
    return HloSharding.subgroup(TileAssignment.from_devices(devices, tuple(tile_dims)), types, metadata)


def is_sub_tiling_or_equal(dims: Sequence[int], sub: HloSharding, s: HloSharding) -> bool:
    """IsSubTilingOrEqualSharding: every device's `sub` tile lies inside its `s` tile."""
    return _is_sub_tiling(tuple(dims), sub, s)


@lru_cache(maxsize=65536)
def _is_sub_tiling(dims: tuple[int, ...], sub: HloSharding, s: HloSharding) -> bool:
    if sub.is_manual or s.is_manual:
        return False
    if s.is_tile_maximal:
        return True
    if sub.is_tile_maximal:
        return False
    rank = sub.tiled_data_rank
    if rank != s.tiled_data_rank or rank != len(dims):
        return False
    p_dims, s_dims = _tiles(sub).dims, _tiles(s).dims
    if any(p_dims[i] < s_dims[i] for i in range(rank)):
        return False
    pb = [-(-dims[i] // p_dims[i]) for i in range(rank)]
    b = [-(-dims[i] // s_dims[i]) for i in range(rank)]
    offsets = {d: [b[j] * idx[j] for j in range(rank)] for d, idx in _device_tiles(s).items()}
    for device, idx in _device_tiles(sub).items():
        base = offsets.get(device, [0] * rank)
        for j in range(rank):
            o = pb[j] * idx[j]
            if o < base[j]:
                return False
            if o + pb[j] <= dims[j] and o + pb[j] > base[j] + b[j]:
                return False
    return True


def find_common_sharding(shardings: Sequence[HloSharding], default: HloSharding | None = None) -> HloSharding:
    """FindCommonSharding: merge all, or fall back to `default` (or the first)."""
    common = shardings[0]
    for s in shardings[1:]:
        if common == s:
            continue
        merged = merge_if_compatible(s, common, common.num_tiles) if not s.is_manual and not common.is_manual else None
        if merged is None:
            return default if default is not None else shardings[0]
        common = merged
    return common

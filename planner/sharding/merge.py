"""Which of two shardings wins: XLA's specificity order and merging.

The propagation lattice: no sharding < replicated < partial tilings < full
tilings, ordered by the number of data tiles; two partial shardings that
tile different dims combine into one with more tiles. A new sharding replaces
an existing tiled one only when it refines it (sub-tiling), unless resharding
is allowed (the instruction has a single non-root user).
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.sharding.algebra import is_sub_tiling_or_equal, merge_if_compatible
from planner.sharding.hlo_sharding import HloSharding, Kind


def is_spatially_partitioned(s: HloSharding) -> bool:
    """Not pinned to a single device (XLA's IsSpatiallyPartitioned)."""
    if s.is_tuple:
        return any(is_spatially_partitioned(e) for e in s.elements)
    return s.kind is not Kind.MAXIMAL


def is_more_specific(lhs: HloSharding, rhs: HloSharding) -> bool:
    """IsShardingMoreSpecific."""
    if lhs.is_tuple:
        assert rhs.is_tuple and len(lhs.elements) == len(rhs.elements), f"{lhs} <> {rhs}"
        if any(is_more_specific(b, a) for a, b in zip(lhs.elements, rhs.elements)):
            return False
        return any(is_more_specific(a, b) for a, b in zip(lhs.elements, rhs.elements))
    return _leaf_more_specific(lhs, rhs)


def _leaf_more_specific(lhs: HloSharding, rhs: HloSharding) -> bool:
    if lhs.kind is Kind.MANUAL and rhs.is_tile_maximal:
        return True
    if lhs.kind is Kind.MANUAL or rhs.kind is Kind.MANUAL:
        return False
    if not rhs.is_tile_maximal:
        return lhs.num_tiles > rhs.num_tiles
    if rhs.is_replicated:
        return not lhs.is_replicated
    return not lhs.is_tile_maximal


def merge_sharding(existing: HloSharding, candidate: HloSharding, combine_partial: bool) -> HloSharding | None:
    """MergeSharding: the candidate (possibly combined with `existing`) if it is better, else None."""
    if existing.is_tuple:
        assert candidate.is_tuple and len(existing.elements) == len(candidate.elements)
        changed = False
        elements = []
        for old, new in zip(existing.elements, candidate.elements):
            better = None if old == new else merge_sharding(old, new, combine_partial)
            changed |= better is not None
            # XLA keeps the candidate's element even where it is not better.
            elements.append(better if better is not None else new)
        return HloSharding.tuple_of(tuple(elements)) if changed else None
    if (
        combine_partial
        and existing.has_partial_replication
        and candidate.has_partial_replication
        and existing.tile_assignment is not None
        and candidate.tile_assignment is not None
        and existing.tile_assignment.num_devices == candidate.tile_assignment.num_devices
    ):
        merged = merge_if_compatible(existing, candidate, max(existing.num_tiles, candidate.num_tiles) + 1)
        if merged is not None:
            return merged
    return candidate if _leaf_more_specific(candidate, existing) else None


def _strictly_better(lhs: HloSharding, rhs: HloSharding) -> bool:
    """IsShardingStrictlyBetter: manual where the other is tile-maximal, never the reverse."""
    return _manual_against_maximal(lhs, rhs) == 1


def _manual_against_maximal(a: HloSharding, b: HloSharding) -> int:
    """Bit 1: some leaf of `a` is manual where `b`'s is tile-maximal; bit 2: the reverse.

    A module-level recursion, not a closure: a nested recursive function is a reference cycle, left
    for the cycle collector on every one of the many calls propagation makes.
    """
    if a.is_tuple and b.is_tuple:
        mask = 0
        for x, y in zip(a.elements, b.elements):
            mask |= _manual_against_maximal(x, y)
        return mask
    mask = 0
    if a.kind is Kind.MANUAL and b.is_tile_maximal:
        mask |= 1
    if b.kind is Kind.MANUAL and a.is_tile_maximal:
        mask |= 2
    return mask


def improved_sharding(
    candidate: HloSharding,
    existing: HloSharding | None,
    dims: Sequence[int] | None,
    combine_partial: bool,
    allow_aggressive: bool = False,
) -> HloSharding | None:
    """ReturnImprovedShardingImpl: what to set, or None to leave `existing`.

    `dims` is the instruction's array shape (None for tuples).
    """
    if existing is not None and candidate == existing:
        return None
    if existing is not None and _strictly_better(candidate, existing):
        return candidate
    if not is_spatially_partitioned(candidate):
        return None
    if existing is None:
        return candidate
    if candidate.is_manual:
        return None
    tiles = candidate.num_tiles if not candidate.is_tuple else 0
    merged = merge_sharding(existing, candidate, combine_partial)
    if merged is None:
        return None
    if (
        not allow_aggressive
        and dims is not None
        and not existing.is_tuple
        and not existing.is_tile_maximal
        and merged.num_tiles == tiles
        and not is_sub_tiling_or_equal(dims, merged, existing)
    ):
        return None
    return merged

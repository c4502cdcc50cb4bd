"""Sharding values with XLA's HloSharding semantics."""

from planner.sharding.hlo_sharding import HloSharding, Kind, ShardGroup
from planner.sharding.text import parse_sharding
from planner.sharding.tile_assignment import Iota, TileAssignment

__all__ = ["HloSharding", "Iota", "Kind", "ShardGroup", "TileAssignment", "clear_caches", "parse_sharding"]


def clear_caches() -> None:
    """Forgets what the sharding algebra memoises across calls (`planner.clear_caches` clears every package's)."""
    from planner.sharding import algebra, named_text, reshape, text

    for cached in (
        algebra._partially_replicate,
        algebra.merge_if_compatible,
        algebra._is_sub_tiling,
        reshape._through_reshape,
        text._parse_flat_cached,
        named_text.parse_named_sharding,
    ):
        cached.cache_clear()

"""Sharding values with XLA's HloSharding semantics."""

from planner.sharding.hlo_sharding import HloSharding, Kind, ShardGroup
from planner.sharding.text import parse_sharding
from planner.sharding.tile_assignment import Iota, TileAssignment

__all__ = ["HloSharding", "Iota", "Kind", "ShardGroup", "TileAssignment", "clear_caches", "parse_sharding"]


def clear_caches() -> None:
    """Forgets what is memoised across calls: sharding algebra, parse-time checks (benchmarks run cold)."""
    from planner.hlo import instruction_checks, opcode_attributes
    from planner.sharding import algebra, reshape, text

    for cached in (
        algebra._partially_replicate,
        algebra.merge_if_compatible,
        algebra._is_sub_tiling,
        reshape._through_reshape,
        text._parse_flat_cached,
        instruction_checks.literal_problem,
        opcode_attributes._names_problem,
        opcode_attributes.metadata_problem,
        opcode_attributes.shape_attribute_problem,
        opcode_attributes.window_problem,
    ):
        cached.cache_clear()
    opcode_attributes._BY_TEXT.clear()

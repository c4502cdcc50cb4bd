"""Sharding values with XLA's HloSharding semantics."""

from planner.sharding.hlo_sharding import HloSharding, Kind, ShardGroup
from planner.sharding.text import parse_sharding
from planner.sharding.tile_assignment import Iota, TileAssignment

__all__ = ["HloSharding", "Iota", "Kind", "ShardGroup", "TileAssignment", "parse_sharding"]

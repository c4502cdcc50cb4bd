"""Reading HloSharding text (`sharding={...}`), as XLA's parser reads it.

Inside the braces the words may come in any order: `replicated`, `manual`,
`unknown`, `unreduced`, `maximal device=N`, `devices=[dims]ids-or-iota`,
`last_tile_dim_replicate`, `last_tile_dims={types}`, `shard_as N`,
`shard_like N`, `metadata={...}`. A brace right after the opening one makes a
tuple of such shardings. Printing is `HloSharding.to_text()`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from functools import lru_cache

from planner.errors import HloParseError
from planner.mesh import MAX_DEVICES
from planner.scanner import Cursor, skip_balanced
from planner.sharding.hlo_sharding import SUBGROUP_ORDER, HloSharding, ShardGroup
from planner.sharding.named_text import is_named_sharding, named_to_hlo, read_named_body
from planner.sharding.tile_assignment import TileAssignment

_WORD = re.compile(r"[a-z_]+")
_INT_LIST_BRACKETS = re.compile(r"\[\s*(\d+(?:\s*,\s*\d+)*)?\s*\]")
_DEVICE_LIST = re.compile(r"\d+(?:\s*,\s*\d+)*")
_IOTA = re.compile(r"<=\s*\[\s*(\d+(?:\s*,\s*\d+)*)\s*\](?:\s*T\s*\(\s*(\d+(?:\s*,\s*\d+)*)\s*\))?")
# The words that make a sharding of one kind (XLA's `{unreduced}`: jaxlib >= 0.12).
_KINDS = ("replicated", "maximal", "manual", "unknown", "unreduced")
# The whole of a simple sharding, for the cache fast path (no nested braces).
_FLAT_SHARDING = re.compile(r"\{[^{}\"\n]*\}")


def parse_sharding(text: str) -> HloSharding:
    """Parses a standalone sharding such as `{devices=[2,2]<=[4]}`."""
    cursor = Cursor(text)
    sharding = parse_sharding_at(cursor)
    if not cursor.at_end():
        cursor.fail(f"unexpected {cursor.describe_next()} after the sharding")
    return sharding


def parse_sharding_at(cursor: Cursor) -> HloSharding:
    """Reads one sharding (single or tuple) at the cursor.

    Real dumps repeat a handful of sharding strings thousands of times, so
    brace-free ones are parsed once and served from a cache.
    """
    start = cursor.skip_space()
    flat = _FLAT_SHARDING.match(cursor.text, start)
    if flat is not None:
        try:
            sharding = _parse_flat_cached(flat.group(0))
        except HloParseError as e:
            # Re-locate the error inside the caller's text.
            cursor.fail(e.message, start + e.column - 1)
        cursor.pos = flat.end()
        return sharding
    if cursor.text.startswith("{", start):
        after = Cursor(cursor.text, start + 1, cursor.source)
        if after.peek() in ("{", "}"):
            return _parse_tuple(cursor)
    return _parse_single(cursor)


@lru_cache(maxsize=4096)
def _parse_flat_cached(text: str) -> HloSharding:
    cursor = Cursor(text)
    if Cursor(text, 1).peek() == "}":
        cursor.expect("{")
        cursor.expect("}")
        return HloSharding.tuple_of(())
    return _parse_single(cursor)


def _parse_tuple(cursor: Cursor) -> HloSharding:
    cursor.expect("{")
    elements: list[HloSharding] = []
    if cursor.try_literal("}"):
        return HloSharding.tuple_of(())
    while True:
        if cursor.peek() != "{":
            cursor.fail(f"expected '{{' to start a tuple element sharding, found {cursor.describe_next()}")
        nested = Cursor(cursor.text, cursor.pos + 1, cursor.source)
        if nested.peek() == "{":
            cursor.fail("tuple shardings cannot nest: each element must be a single sharding", nested.pos)
        elements.append(_parse_single(cursor))
        if cursor.try_literal("}"):
            return HloSharding.tuple_of(tuple(elements))
        cursor.expect(",", "or '}' between tuple element shardings")


def parse_tile_assignment_at(cursor: Cursor) -> TileAssignment:
    """Reads `[dims]ids` or `[dims]<=[reshape]T(perm)` at the cursor."""
    dims_pos = cursor.skip_space()
    m = cursor.match(_INT_LIST_BRACKETS, "tile dims like [4,2]")
    if m.group(1) is None:
        cursor.fail("tile assignment dims must not be empty", dims_pos)
    dims = tuple(int(x) for x in m.group(1).split(","))
    if math.prod(dims) > MAX_DEVICES:
        cursor.fail(f"tile assignment {list(dims)} has {math.prod(dims):,} tiles, more than the {MAX_DEVICES:,} "
                    "devices the planner reads", dims_pos)  # fmt: skip
    devices_pos = cursor.skip_space()
    try:
        iota = cursor.try_match(_IOTA)
        if iota is not None:
            reshape = tuple(int(x) for x in iota.group(1).split(","))
            perm = tuple(int(x) for x in iota.group(2).split(",")) if iota.group(2) else None
            return TileAssignment.from_iota(dims, reshape, perm)
        listed = cursor.match(_DEVICE_LIST, "a device list like 0,1,2,3 or an iota like <=[4]")
        devices = tuple(int(x) for x in listed.group(0).split(","))
        return TileAssignment.from_devices(list(devices), dims)
    except (ValueError, OverflowError) as e:  # OverflowError: a device id beyond int64
        cursor.fail(str(e), devices_pos)


def _parse_single(cursor: Cursor) -> HloSharding:
    open_pos = cursor.skip_space()
    if is_named_sharding(cursor.text, open_pos):
        return _parse_named(cursor, open_pos)
    cursor.expect("{", "to open a sharding")
    flags: set[str] = set()
    device: int | None = None
    tiles: TileAssignment | None = None
    tiles_pos = 0
    subgroup_types: tuple[str, ...] = ()
    group: ShardGroup | None = None
    metadata: tuple[str, ...] = ()
    while not cursor.try_literal("}"):
        if cursor.at_end():
            cursor.fail("input ends inside a sharding: expected '}'", open_pos)
        word_pos = cursor.skip_space()
        word = cursor.match(_WORD, "a sharding keyword (replicated, maximal, manual, unknown, devices=...)").group(0)
        if word in (*_KINDS, "last_tile_dim_replicate"):
            flags.add(word)
        elif word == "device":
            cursor.expect("=", "after 'device'")
            device = cursor.parse_int("a device id")
        elif word == "devices":
            cursor.expect("=", "after 'devices'")
            tiles_pos = cursor.skip_space()
            tiles = parse_tile_assignment_at(cursor)
        elif word == "last_tile_dims":
            cursor.expect("=", "after 'last_tile_dims'")
            subgroup_types = _parse_subgroup_types(cursor)
        elif word in ("shard_as", "shard_like"):
            group = ShardGroup(cursor.parse_int(f"a group id after '{word}'"), word == "shard_as")
        elif word == "metadata":
            cursor.expect("=", "after 'metadata'")
            metadata = _parse_metadata(cursor)
        else:
            cursor.fail(f"unknown word '{word}' in sharding", word_pos)
    return _build(cursor, open_pos, flags, device, tiles, tiles_pos, subgroup_types, metadata).with_shard_group(group)


def _parse_named(cursor: Cursor, open_pos: int) -> HloSharding:
    """A Shardy sharding written natively (`planner.sharding.named_text`), as the HloSharding it places data by."""
    cursor.expect("{", "to open a sharding")
    named = read_named_body(cursor)
    try:
        return dataclasses.replace(named_to_hlo(named), named=named)
    except ValueError as e:
        cursor.fail(f"the named sharding has no HloSharding: {e}", open_pos)


def _build(cursor: Cursor, open_pos: int, flags: set[str], device: int | None, tiles: TileAssignment | None,
           tiles_pos: int, subgroup_types: tuple[str, ...], metadata: tuple[str, ...]) -> HloSharding:  # fmt: skip
    kinds = flags & set(_KINDS)
    if len(kinds) > 1:
        cursor.fail(f"a sharding cannot be both {' and '.join(sorted(kinds))}", open_pos)
    if kinds and tiles is not None:
        cursor.fail(f"{next(iter(kinds))} shardings cannot have devices=[...]", tiles_pos)
    if "maximal" in kinds:
        if device is None:
            cursor.fail("maximal shardings need device=N", open_pos)
        return HloSharding.maximal(device, metadata)
    if device is not None:
        cursor.fail("device=N only goes with maximal", open_pos)
    if kinds:
        return {"replicated": HloSharding.replicate, "manual": HloSharding.manual, "unknown": HloSharding.unknown,
                "unreduced": HloSharding.unreduced}[next(iter(kinds))](metadata)  # fmt: skip
    if tiles is None:
        cursor.fail("a sharding needs replicated, maximal, manual, unknown or devices=[...]", open_pos)
    if tiles.iota is None and tiles.num_devices == 1:
        cursor.fail("non-maximal shardings must have more than one device assigned", tiles_pos)
    try:
        if subgroup_types:
            if "last_tile_dim_replicate" in flags:
                cursor.fail("last_tile_dims={...} and last_tile_dim_replicate cannot be combined", open_pos)
            return HloSharding.subgroup(tiles, subgroup_types, metadata)
        if "last_tile_dim_replicate" in flags:
            return HloSharding.partial_tile(tiles, metadata)
        return HloSharding.tile(tiles, metadata)
    except ValueError as e:
        cursor.fail(str(e), tiles_pos)


def _parse_subgroup_types(cursor: Cursor) -> tuple[str, ...]:
    cursor.expect("{", "to open last_tile_dims")
    types: list[str] = []
    while True:
        pos = cursor.skip_space()
        word = cursor.match(_WORD, "a subgroup type (manual, unreduced, replicated)").group(0)
        if word not in SUBGROUP_ORDER:
            cursor.fail(f"unknown subgroup type '{word}' (expected one of {', '.join(SUBGROUP_ORDER)})", pos)
        types.append(word)
        if cursor.try_literal("}"):
            return tuple(types)
        cursor.expect(",", "or '}' in last_tile_dims")


def _parse_metadata(cursor: Cursor) -> tuple[str, ...]:
    """One `{...}` entry, or a brace list of them; kept verbatim."""
    start = cursor.skip_space()
    if cursor.text.startswith("{", start) and Cursor(cursor.text, start + 1).peek() == "{":
        cursor.expect("{")
        entries: list[str] = []
        while True:
            entry_start = cursor.skip_space()
            skip_balanced(cursor, "sharding metadata")
            entries.append(cursor.text[entry_start : cursor.pos])
            if cursor.try_literal("}"):
                return tuple(entries)
            cursor.expect(",", "or '}' between metadata entries")
    if not cursor.text.startswith("{", start):
        cursor.fail(f"expected '{{' to open metadata, found {cursor.describe_next()}")
    skip_balanced(cursor, "sharding metadata")
    text = cursor.text[start : cursor.pos]
    return () if text.replace(" ", "") == "{}" else (text,)

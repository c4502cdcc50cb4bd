"""HloSharding: how an array (or each element of a tuple) is split over devices.

Forms, as XLA writes them:

    {replicated}                      every device holds the whole array
    {maximal device=3}                only device 3 holds it
    {manual}                          the program is already per-device here
    {unknown}                         no decision yet (shard_as/shard_like groups)
    {unreduced}                       every device holds a partial sum of the whole
                                      array, not yet reduced (jaxlib >= 0.12)
    {devices=[4,1,2]<=[8]}            tiled: dim 0 in 4 tiles, dim 2 in 2 tiles
    {devices=[4,1,2]<=[8] last_tile_dim_replicate}
                                      partial: dim 0 in 4 tiles; the last tile
                                      dim (2) lists devices holding the same tile
    {devices=[2,1,2,2]<=[8] last_tile_dims={manual, replicated}}
                                      trailing tile dims are subgroups
    {devices=[2,1,2]<=[4] last_tile_dims={unreduced}}
                                      dim 0 in 2 tiles; the devices of a last-dim
                                      group hold partial sums of the same tile
    {{replicated}, {devices=[2]0,1}}  a tuple, one sharding per leaf

Worked example of partial replication: `{devices=[4,1,2]<=[8]
last_tile_dim_replicate}` on f32[8,16] gives tiles of f32[2,16]; devices 0 and
1 hold rows 0-1, devices 2 and 3 rows 2-3, and so on.

Construction canonicalises as XLA does (a partial tile whose replication dim
spans every device is replicated; devices within a replication group are
sorted; subgroup dims of one type merge, size-1 ones drop, subgroups sort
manual, unreduced, replicated). Equality ignores metadata but compares shard groups.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from planner.sharding.tile_assignment import Iota, TileAssignment

if TYPE_CHECKING:
    from planner.sharding.named_text import NamedSharding


class Kind(Enum):
    REPLICATED = "replicated"
    MAXIMAL = "maximal"
    MANUAL = "manual"
    UNKNOWN = "unknown"
    UNREDUCED = "unreduced"
    TILED = "tiled"
    TUPLE = "tuple"


# Subgroup types in XLA's canonical order (`HloSharding::Subgroup`'s kOrderedTypes:
# MANUAL, then UNREDUCED, before REPLICATED), as printed inside `last_tile_dims={...}`.
SUBGROUP_ORDER = ("maximal", "manual", "unreduced", "replicated", "unknown")


@dataclass(frozen=True, slots=True)
class ShardGroup:
    """`shard_as N` (members get one sharding) or `shard_like N` (they hint)."""

    id: int
    shard_as: bool

    def to_text(self) -> str:
        return f" {'shard_as' if self.shard_as else 'shard_like'} {self.id}"


@dataclass(frozen=True, slots=True, eq=False)
class HloSharding:
    kind: Kind
    tile_assignment: TileAssignment | None = None
    device: int | None = None
    replicate_on_last_tile_dim: bool = False
    subgroup_types: tuple[str, ...] = ()
    elements: tuple[HloSharding, ...] = ()
    shard_group: ShardGroup | None = None
    # Verbatim `{op_name=...}` entries; not part of equality.
    metadata: tuple[str, ...] = ()
    # The Shardy sharding the text wrote natively (`{mesh['x'=4], [{'x'}, {?}]}`), read once by the parser so
    # Shardy's reader never parses it again; None for a sharding written the classic way. Not part of
    # equality: it places data as the HloSharding does.
    named: NamedSharding | None = field(default=None, compare=False, repr=False)
    # Derived once at construction: propagation compares and ranks shardings
    # millions of times.
    _data_rank: int = field(init=False, repr=False, compare=False, default=0)
    _num_tiles: int = field(init=False, repr=False, compare=False, default=1)
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        if (self.kind is Kind.TILED) != (self.tile_assignment is not None):
            raise ValueError(f"{self.kind.value} sharding and tile assignment {self.tile_assignment} do not fit")
        if self.kind is Kind.MAXIMAL and (self.device is None or self.device < 0):
            raise ValueError(f"maximal sharding needs a device id >= 0, got {self.device}")
        if self.replicate_on_last_tile_dim and self.subgroup_types:
            raise ValueError("last_tile_dim_replicate and last_tile_dims={...} cannot be combined")
        if self.kind is Kind.TILED:
            assert self.tile_assignment is not None
            reserved = len(self.subgroup_types) + int(self.replicate_on_last_tile_dim)
            if reserved > self.tile_assignment.rank:
                raise ValueError(f"tile assignment {list(self.tile_assignment.dims)} has no room for "
                                 f"{reserved} replication/subgroup dims")  # fmt: skip
            unknown = set(self.subgroup_types) - set(SUBGROUP_ORDER)
            if unknown:
                raise ValueError(f"unknown subgroup type(s) {sorted(unknown)}")
            rank = self.tile_assignment.rank - reserved
            object.__setattr__(self, "_data_rank", rank)
            object.__setattr__(self, "_num_tiles", math.prod(self.tile_assignment.dims[:rank]))
        object.__setattr__(self, "_hash", hash(self._key()))

    # -- constructors (canonicalising, like XLA's) --------------------------

    @staticmethod
    def replicate(metadata: tuple[str, ...] = ()) -> HloSharding:
        return HloSharding(Kind.REPLICATED, metadata=metadata)

    @staticmethod
    def manual(metadata: tuple[str, ...] = ()) -> HloSharding:
        return HloSharding(Kind.MANUAL, metadata=metadata)

    @staticmethod
    def unknown(metadata: tuple[str, ...] = ()) -> HloSharding:
        return HloSharding(Kind.UNKNOWN, metadata=metadata)

    @staticmethod
    def unreduced(metadata: tuple[str, ...] = ()) -> HloSharding:
        return HloSharding(Kind.UNREDUCED, metadata=metadata)

    @staticmethod
    def maximal(device: int, metadata: tuple[str, ...] = ()) -> HloSharding:
        return HloSharding(Kind.MAXIMAL, device=device, metadata=metadata)

    @staticmethod
    def tile(tiles: TileAssignment, metadata: tuple[str, ...] = ()) -> HloSharding:
        return HloSharding(Kind.TILED, tiles, metadata=metadata)

    @staticmethod
    def partial_tile(tiles: TileAssignment, metadata: tuple[str, ...] = ()) -> HloSharding:
        """Tiled on all but the last tile dim, replicated across the last."""
        group = tiles.dims[-1]
        if tiles.rank == 1 or group == tiles.num_devices:
            return HloSharding.replicate(metadata)
        if group == 1:
            return HloSharding.tile(tiles.reshape(tiles.dims[:-1]), metadata)
        return HloSharding(Kind.TILED, _sort_last_dim_groups(tiles), replicate_on_last_tile_dim=True,
                           metadata=metadata)  # fmt: skip

    @staticmethod
    def subgroup(tiles: TileAssignment, types: tuple[str, ...], metadata: tuple[str, ...] = ()) -> HloSharding:
        """Trailing tile dims typed as subgroups (manual, replicated, ...)."""
        if not types:
            return HloSharding.tile(tiles, metadata)
        num_data = tiles.rank - len(types)
        if num_data < 0:
            raise ValueError(f"{len(types)} subgroup types but only {tiles.rank} tile dims")
        if len(set(types)) == 1 and math.prod(tiles.dims[:num_data]) == 1:
            if types[0] == "manual":
                return HloSharding.manual(metadata)
            if types[0] == "replicated":
                return HloSharding.replicate(metadata)
            if types[0] == "unreduced":
                return HloSharding.unreduced(metadata)
        by_type: dict[str, list[int]] = {}
        needs_merging = False
        for i, t in enumerate(types):
            dim = num_data + i
            if tiles.dims[dim] == 1:
                needs_merging = True
                continue
            needs_merging |= t in by_type
            by_type.setdefault(t, []).append(dim)
        needs_merging |= len(by_type) > 1
        if needs_merging:
            perm = list(range(num_data))
            merged_dims = list(tiles.dims[:num_data])
            merged_types: list[str] = []
            for t in SUBGROUP_ORDER:
                dims = by_type.get(t)
                if not dims:
                    continue
                perm.extend(dims)
                merged_dims.append(math.prod(tiles.dims[d] for d in dims))
                merged_types.append(t)
            # Size-1 dims carry no devices; move them last so the transpose
            # stays a permutation, then drop them in the reshape.
            perm.extend(d for d in range(tiles.rank) if d not in perm)
            tiles = tiles.transpose(tuple(perm)).reshape(tuple(merged_dims))
            types = tuple(merged_types)
        return _typed_subgroup(tiles, types, metadata)

    @staticmethod
    def tuple_of(elements: tuple[HloSharding, ...]) -> HloSharding:
        return HloSharding(Kind.TUPLE, elements=tuple(elements))

    def with_shard_group(self, group: ShardGroup | None) -> HloSharding:
        return dataclasses.replace(self, shard_group=group)

    def with_metadata(self, metadata: tuple[str, ...]) -> HloSharding:
        return dataclasses.replace(self, metadata=metadata)

    # -- predicates ---------------------------------------------------------

    @property
    def is_tuple(self) -> bool:
        return self.kind is Kind.TUPLE

    @property
    def is_replicated(self) -> bool:
        if self.kind is Kind.TUPLE:
            return all(e.is_replicated for e in self.elements)
        return self.kind is Kind.REPLICATED

    @property
    def is_manual(self) -> bool:
        if self.kind is Kind.TUPLE:
            return bool(self.elements) and all(e.is_manual for e in self.elements)
        return self.kind is Kind.MANUAL

    @property
    def is_unknown(self) -> bool:
        if self.kind is Kind.TUPLE:
            return bool(self.elements) and all(e.is_unknown for e in self.elements)
        return self.kind is Kind.UNKNOWN

    @property
    def is_tiled(self) -> bool:
        return self.kind is Kind.TILED

    @property
    def is_tile_maximal(self) -> bool:
        """One device or all devices hold the whole array (XLA's IsTileMaximal)."""
        if self.kind is Kind.TUPLE:
            return all(e.is_tile_maximal for e in self.elements)
        return self.kind in (Kind.REPLICATED, Kind.MAXIMAL)

    @property
    def has_partial_replication(self) -> bool:
        return self.replicate_on_last_tile_dim or "replicated" in self.subgroup_types

    @property
    def tiled_data_rank(self) -> int:
        """Tile dims that split data, without replication and subgroup dims."""
        assert self.tile_assignment is not None, f"{self.to_text()} is not tiled"
        return self._data_rank

    @property
    def data_tile_dims(self) -> tuple[int, ...]:
        assert self.tile_assignment is not None, f"{self.to_text()} is not tiled"
        return self.tile_assignment.dims[: self._data_rank]

    @property
    def num_tiles(self) -> int:
        """Distinct data tiles (1 for replicated, maximal and manual)."""
        return self._num_tiles

    # -- per-device shapes --------------------------------------------------

    def shard_shape(self, dims: tuple[int, ...]) -> tuple[int, ...]:
        """Per-device dims of an array with `dims` under this sharding.

        Each dim becomes ceil(dim / tiles): f32[10] over 4 tiles is f32[3] on
        every device (the last device's tile is padded).
        """
        if self.kind is not Kind.TILED:
            return tuple(dims)
        tiles = self.data_tile_dims
        if len(tiles) != len(dims):
            raise ValueError(f"sharding {self.to_text()} tiles {len(tiles)} dims but the array has {len(dims)}")
        return tuple(-(-d // t) for d, t in zip(dims, tiles))

    # -- equality and text --------------------------------------------------

    def _key(self) -> tuple[object, ...]:
        return (
            self.kind,
            self.tile_assignment,
            self.device,
            self.replicate_on_last_tile_dim,
            self.subgroup_types,
            self.elements,
            self.shard_group,
        )

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, HloSharding):
            return NotImplemented
        return self._hash == other._hash and self._key() == other._key()

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"HloSharding({self.to_text()})"

    def to_text(self, include_metadata: bool = False) -> str:
        """XLA's canonical text (`HloSharding::ToString`)."""
        if self.kind is Kind.TUPLE:
            parts = [
                (f"/*index={i}*/" if i and i % 5 == 0 else "") + e.to_text(include_metadata)
                for i, e in enumerate(self.elements)
            ]
            return "{" + ", ".join(parts) + "}"
        if self.kind is Kind.TILED:
            assert self.tile_assignment is not None
            body = self.tile_assignment.to_text()
            if self.replicate_on_last_tile_dim:
                body += " last_tile_dim_replicate"
            if self.subgroup_types:
                body += " last_tile_dims={" + ", ".join(self.subgroup_types) + "}"
        elif self.kind is Kind.MAXIMAL:
            body = f"maximal device={self.device}"
        else:
            body = self.kind.value
        if self.shard_group is not None:
            body += self.shard_group.to_text()
        if include_metadata and self.metadata:
            body += " metadata=" + (
                self.metadata[0] if len(self.metadata) == 1 else "{" + ", ".join(self.metadata) + "}"
            )
        return "{" + body + "}"

    def to_short_text(self) -> str:
        """The same text, with every tile assignment that is an iota written as one.

        `{devices=[2,4]0,2,4,6,1,3,5,7}` is `{devices=[2,4]<=[4,2]T(1,0)}`, XLA's short form, which its
        parser reads as the same sharding. For people (plans, reports): modules keep the form they
        were written in when printed.
        """
        return self._with_iotas().to_text()

    def _with_iotas(self) -> HloSharding:
        if self.kind is Kind.TUPLE:
            return dataclasses.replace(self, elements=tuple(e._with_iotas() for e in self.elements))
        if self.tile_assignment is None or self.tile_assignment.iota is not None:
            return self
        return dataclasses.replace(self, tile_assignment=self.tile_assignment.as_iota())

    def __str__(self) -> str:
        return self.to_text()


def _typed_subgroup(tiles: TileAssignment, types: tuple[str, ...], metadata: tuple[str, ...]) -> HloSharding:
    if not types:
        # Every subgroup dim had size 1: a plain tiling is left.
        return HloSharding.tile(tiles, metadata)
    if types == ("replicated",):
        return HloSharding.partial_tile(tiles, metadata)
    if types == ("manual",) and tiles.num_devices == tiles.dims[-1]:
        return HloSharding.manual(metadata)
    if types[-1] == "replicated":
        # Devices inside a replication group are sorted, as for a partial tile.
        tiles = _sort_last_dim_groups(tiles)
    return HloSharding(Kind.TILED, tiles, subgroup_types=types, metadata=metadata)


def _sort_last_dim_groups(tiles: TileAssignment) -> TileAssignment:
    """Sorts the devices of each last-dim group (a replication group).

    Devices in one group hold the same data, so their order carries nothing;
    sorting gives one canonical assignment. An iota stays an iota: the group
    is made of the minor-most transposed iota dims (splitting one if the group
    ends inside it), and sorting the group means reading those dims in source
    order. Worked example: [2,4]<=[2,2,2]T(2,1,0) has groups {0,4,2,6} and
    {1,5,3,7}; the group dims are source dims 1 and 0, read as (0,1) that is
    [2,4]<=[4,2]T(1,0): {0,2,4,6} and {1,3,5,7}.
    """
    group = tiles.dims[-1]
    if tiles.iota is not None:
        sorted_iota = _iota_with_sorted_minor_group(tiles.iota, group)
        if sorted_iota is not None:
            return TileAssignment(tiles.dims, iota=sorted_iota)
    array = tiles.array().reshape(-1, group)
    return TileAssignment(tiles.dims, explicit=tuple(np.sort(array, axis=1).reshape(-1).tolist()))


def _iota_with_sorted_minor_group(iota: Iota, group: int) -> Iota | None:
    dims = list(iota.reshape_dims)
    perm = list(iota.perm)
    remaining = group
    grouped = 0
    for i in range(len(perm) - 1, -1, -1):
        size = dims[perm[i]]
        if size <= remaining:
            if remaining % size:
                return None
            remaining //= size
            grouped += 1
            continue
        if size % remaining:
            return None
        # The group ends inside this dim: split it into (major, minor=remaining).
        split = perm[i]
        dims[split : split + 1] = [size // remaining, remaining]
        perm = [p + 1 if p > split else p for p in perm]
        perm.insert(i + 1, split + 1)
        grouped += 1
        remaining = 1
        break
    if remaining != 1 and grouped == len(iota.perm):
        return None
    head, tail = perm[: len(perm) - grouped], perm[len(perm) - grouped :]
    return Iota.canonical(tuple(dims), tuple(head + sorted(tail)))

"""Tile assignments: which device holds which tile of a sharded array.

A tile assignment is an N-d array of device ids, one entry per tile. XLA
writes it either as an explicit list or as an iota:

    devices=[4,2]0,1,2,3,4,5,6,7      explicit: row-major device ids
    devices=[4,2]<=[8]                the same devices as an iota
    devices=[2,4]<=[4,2]T(1,0)        iota(8) reshaped to [4,2], transposed
                                      by (1,0) to [2,4], then read as [2,4]:
                                      [[0,2,4,6],[1,3,5,7]]

Two assignments are equal when their dims and device arrays are equal,
whichever way they were written; printing keeps the written form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class Iota:
    """`<=[reshape_dims]T(perm)`: iota(prod) reshaped, then transposed."""

    reshape_dims: tuple[int, ...]
    perm: tuple[int, ...]

    def __post_init__(self) -> None:
        if sorted(self.perm) != list(range(len(self.reshape_dims))):
            raise ValueError(f"transpose perm {self.perm} is not a permutation of {len(self.reshape_dims)} dims")

    @staticmethod
    def canonical(reshape_dims: tuple[int, ...], perm: tuple[int, ...]) -> Iota:
        """Drops size-1 dims and merges dims the transpose keeps adjacent.

        `<=[2,2,2]T(0,1,2)` and `<=[8]` are one iota; XLA prints the short one.
        """
        Iota(reshape_dims, perm)  # validates the permutation
        keep = [d for d in range(len(reshape_dims)) if reshape_dims[d] != 1]
        renumber = {d: i for i, d in enumerate(keep)}
        dims = [reshape_dims[d] for d in keep]
        order = [renumber[p] for p in perm if p in renumber]
        # Merge runs where the transpose reads consecutive source dims in order.
        merged_dims: list[int] = []
        merged_order: list[list[int]] = []
        for p in order:
            if merged_order and merged_order[-1][-1] + 1 == p:
                merged_order[-1].append(p)
            else:
                merged_order.append([p])
        # Each merged group becomes one source dim; renumber by source order.
        groups_by_source = sorted(range(len(merged_order)), key=lambda g: merged_order[g][0])
        new_index = {g: i for i, g in enumerate(groups_by_source)}
        for g in groups_by_source:
            merged_dims.append(math.prod(dims[p] for p in merged_order[g]))
        new_perm = tuple(new_index[g] for g in range(len(merged_order)))
        if not merged_dims:
            return Iota((1,), (0,))
        if new_perm == tuple(range(len(new_perm))):
            return Iota((math.prod(merged_dims),), (0,))
        return Iota(tuple(merged_dims), new_perm)

    @property
    def is_identity(self) -> bool:
        return self.perm == tuple(range(len(self.perm)))

    def to_text(self) -> str:
        text = "<=[" + ",".join(map(str, self.reshape_dims)) + "]"
        if not self.is_identity:
            text += "T(" + ",".join(map(str, self.perm)) + ")"
        return text


@dataclass(frozen=True, slots=True, eq=False)
class TileAssignment:
    """Tile dims plus devices, given as an explicit list or as an iota."""

    dims: tuple[int, ...]
    iota: Iota | None = None
    explicit: tuple[int, ...] | None = None
    _flat: tuple[int, ...] = field(default=(), repr=False)
    _hash: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if (self.iota is None) == (self.explicit is None):
            raise ValueError("a tile assignment is either an iota or an explicit device list")
        if not self.dims or any(d <= 0 for d in self.dims):
            raise ValueError(f"tile assignment dims {list(self.dims)} must be positive")
        count = math.prod(self.dims)
        if self.iota is not None:
            if math.prod(self.iota.reshape_dims) != count:
                raise ValueError(
                    f"iota {self.iota.to_text()} has {math.prod(self.iota.reshape_dims)} devices "
                    f"but tile dims {list(self.dims)} need {count}"
                )
            flat = tuple(
                np.arange(count).reshape(self.iota.reshape_dims).transpose(self.iota.perm).reshape(-1).tolist()
            )
        else:
            assert self.explicit is not None
            if len(self.explicit) != count:
                raise ValueError(f"{len(self.explicit)} devices listed but tile dims {list(self.dims)} need {count}")
            if len(set(self.explicit)) != count or min(self.explicit) < 0:
                raise ValueError(f"device list {list(self.explicit)} repeats a device or has a negative id")
            flat = self.explicit
        object.__setattr__(self, "_flat", flat)
        object.__setattr__(self, "_hash", hash((self.dims, flat)))

    @staticmethod
    def from_iota(dims: tuple[int, ...], reshape_dims: tuple[int, ...] | None = None,
                  perm: tuple[int, ...] | None = None) -> TileAssignment:  # fmt: skip
        reshape_dims = reshape_dims if reshape_dims is not None else (math.prod(dims),)
        perm = perm if perm is not None else tuple(range(len(reshape_dims)))
        return TileAssignment(tuple(dims), iota=Iota.canonical(tuple(reshape_dims), tuple(perm)))

    @staticmethod
    def from_devices(devices: np.ndarray | list[int], dims: tuple[int, ...] | None = None) -> TileAssignment:
        array = np.asarray(devices, dtype=np.int64)
        shape = tuple(dims) if dims is not None else tuple(array.shape)
        return TileAssignment(shape, explicit=tuple(int(d) for d in array.reshape(-1)))

    @property
    def flat_devices(self) -> tuple[int, ...]:
        """Device ids in row-major tile order."""
        return self._flat

    def array(self) -> np.ndarray:
        return np.asarray(self._flat, dtype=np.int64).reshape(self.dims)

    @property
    def num_devices(self) -> int:
        return len(self._flat)

    @property
    def rank(self) -> int:
        return len(self.dims)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, TileAssignment):
            return NotImplemented
        return self._hash == other._hash and self.dims == other.dims and self._flat == other._flat

    def __hash__(self) -> int:
        return self._hash

    def devices_text(self) -> str:
        """The device part after `devices=[dims]`, in the written form."""
        if self.iota is not None:
            return self.iota.to_text()
        return ",".join(map(str, self._flat))

    def to_text(self) -> str:
        return "devices=[" + ",".join(map(str, self.dims)) + "]" + self.devices_text()

    def as_iota(self) -> TileAssignment:
        """The same assignment written as an iota when its devices are one (`find_iota`), else itself."""
        if self.iota is not None:
            return self
        iota = find_iota(self._flat)
        return self if iota is None else TileAssignment(self.dims, iota=iota)

    # -- reshaping and transposing, keeping the iota form where it survives --

    def reshape(self, dims: tuple[int, ...]) -> TileAssignment:
        """The same devices in row-major order, viewed with new tile dims."""
        dims = tuple(dims)
        if math.prod(dims) != self.num_devices:
            raise ValueError(f"cannot reshape tile assignment {list(self.dims)} to {list(dims)}")
        if self.iota is not None:
            return TileAssignment(dims, iota=self.iota)
        return TileAssignment(dims, explicit=self._flat)

    def transpose(self, perm: tuple[int, ...]) -> TileAssignment:
        """Permutes tile dims: new dim i is old dim perm[i]."""
        perm = tuple(perm)
        if sorted(perm) != list(range(self.rank)):
            raise ValueError(f"{perm} is not a permutation of {self.rank} tile dims")
        new_dims = tuple(self.dims[p] for p in perm)
        moved = [p for p in perm if self.dims[p] != 1]
        if moved == sorted(moved):
            # Only size-1 dims move: the row-major device order is unchanged.
            return self.reshape(new_dims)
        if self.iota is not None:
            iota = _transpose_iota(self.iota, self.dims, perm)
            if iota is not None:
                return TileAssignment(new_dims, iota=iota)
        return TileAssignment(new_dims, explicit=tuple(self.array().transpose(perm).reshape(-1).tolist()))


def find_iota(devices: tuple[int, ...]) -> Iota | None:
    """The iota whose devices, in row-major order, are `devices`; None when no iota gives them.

    Read from the minor end: each run of positions that steps through the devices with one stride
    is one transposed iota dim. Worked example: 0,4,1,5,2,6,3,7 steps by 4 twice (a dim of 2,
    stride 4), then those pairs step by 1 four times (a dim of 4, stride 1). Sorted by stride the
    dims are [2 (stride 4), 4 (stride 1)], which is iota(8) reshaped to [2,4]; the positions read
    the stride-1 dim first, so the transpose is (1,0): `<=[2,4]T(1,0)`.
    """
    count = len(devices)
    if count == 0 or sorted(devices) != list(range(count)):
        return None
    runs: list[tuple[int, int]] = []  # (size, stride), minor first
    block = 1
    while block < count:
        stride = devices[block]
        size = 1
        while block * (size + 1) <= count and devices[block * size] == size * stride:
            size += 1
        if size == 1 or count % (block * size):
            return None
        runs.append((size, stride))
        block *= size
    # The strides must be iota(count)'s own: each the product of the sizes of the smaller ones.
    by_stride = sorted(range(len(runs)), key=lambda k: runs[k][1])
    expected = 1
    for k in by_stride:
        if runs[k][1] != expected:
            return None
        expected *= runs[k][0]
    major_first = by_stride[::-1]
    source = {k: i for i, k in enumerate(major_first)}
    reshape_dims = tuple(runs[k][0] for k in major_first)
    perm = tuple(source[k] for k in reversed(range(len(runs))))
    iota = Iota.canonical(reshape_dims, perm) if runs else Iota((1,), (0,))
    flat = np.arange(count).reshape(iota.reshape_dims).transpose(iota.perm).reshape(-1)
    return iota if tuple(flat.tolist()) == tuple(devices) else None


def _transpose_iota(iota: Iota, dims: tuple[int, ...], perm: tuple[int, ...]) -> Iota | None:
    """Transposes an iota-backed assignment without expanding it, if possible.

    The tile dims and the iota's transposed dims are both factorisations of
    the device count; when they have a common refinement, every tile dim is a
    run of (pieces of) iota dims, so permuting tile dims permutes those runs.
    Worked example: dims [2,4] over <=[8] refine to pieces [2,4]; perm (1,0)
    reads piece 1 then piece 0, giving <=[2,4]T(1,0).
    """
    # Transposed iota dims, each tagged with its source dim.
    sources = [(iota.reshape_dims[p], p) for p in iota.perm]
    pieces: list[tuple[int, int]] = []  # (size, source dim), in transposed order
    tile_groups: list[list[int]] = [[] for _ in dims]
    si, ti = 0, 0
    s_left = sources[0][0] if sources else 1
    t_left = dims[0]
    while si < len(sources) and ti < len(dims):
        if s_left % t_left and t_left % s_left:
            return None
        step = min(s_left, t_left)
        if step > 1:
            tile_groups[ti].append(len(pieces))
            pieces.append((step, sources[si][1]))
        s_left //= step
        t_left //= step
        if s_left == 1:
            si += 1
            s_left = sources[si][0] if si < len(sources) else 1
        if t_left == 1:
            ti += 1
            t_left = dims[ti] if ti < len(dims) else 1
    # Split pieces of one source dim are ordered major-to-minor as they appear
    # in the transposed order, which is the order within that source dim.
    order_in_source: dict[int, list[int]] = {}
    for index, (_, src) in enumerate(pieces):
        order_in_source.setdefault(src, []).append(index)
    source_order = [idx for src in sorted(order_in_source) for idx in order_in_source[src]]
    reshape_dims = tuple(pieces[i][0] for i in source_order)
    position = {piece: pos for pos, piece in enumerate(source_order)}
    new_perm = tuple(position[piece] for p in perm for piece in tile_groups[p])
    if not reshape_dims:
        return Iota.canonical((1,), (0,))
    return Iota.canonical(reshape_dims, new_perm)

"""How a tensor is split: each dim with the mesh axes it is split over, the per-device shape, and the axes
it is replicated over; and that as text art, one row per tensor, for the CLI.

Worked example (mesh fsdp=4,tp=2): f32[8,1024,4096] under `{devices=[1,2,1,4]<=[4,2]T(1,0)
last_tile_dim_replicate}` has dim 1 split 2 ways over tp and nothing over fsdp: its row reads
`[ 8 | 1024 tp | 4096 ]`, per device [8,512,4096], replicated over fsdp (each of the 4 fsdp groups holds the
same copy). A dim split over devices no mesh axis (or product of axes) names shows its count, `x4`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from planner.mesh import Mesh
from planner.sharding.hlo_sharding import HloSharding


@dataclass(frozen=True)
class DimSplit:
    size: int
    axes: tuple[str, ...]  # mesh axes, major first; `x4` when no axis names the split


@dataclass(frozen=True)
class TensorSplit:
    name: str
    dims: tuple[DimSplit, ...]
    shard_shape: tuple[int, ...]
    replicated_over: tuple[str, ...]  # mesh axes no dim is split over


def dim_axes(sharding: HloSharding | None, rank: int, mesh: Mesh) -> list[tuple[str, ...]]:
    """For each dim, the mesh axes it is split over (empty when not split or not expressible)."""
    if sharding is None or not sharding.is_tiled or sharding.tile_assignment is None:
        return [() for _ in range(rank)]
    tiles = sharding.tile_assignment
    array = tiles.array()
    coords = np.array(np.unravel_index(np.arange(mesh.num_devices), mesh.shape)).T  # device order -> mesh coords
    position = {device: i for i, device in enumerate(mesh.device_ids)}
    out: list[tuple[str, ...]] = []
    for d in range(min(rank, sharding.tiled_data_rank)):
        count = tiles.dims[d]
        if count == 1:
            out.append(())
            continue
        found: tuple[str, ...] = ()
        for size in range(1, len(mesh.shape) + 1):
            for axes in itertools.combinations(range(len(mesh.shape)), size):
                if int(np.prod([mesh.shape[a] for a in axes])) != count:
                    continue
                groups: dict[int, set[tuple[int, ...]]] = {}
                for index, device in np.ndenumerate(array):
                    key = tuple(int(coords[position[int(device)]][a]) for a in axes)
                    groups.setdefault(int(index[d]), set()).add(key)
                if len(groups) == count and all(len(v) == 1 for v in groups.values()):
                    found = tuple(mesh.axis_names[a] for a in axes)
                    break
            if found:
                break
        out.append(found)
    return out + [() for _ in range(rank - len(out))]


def tensor_split(name: str, dims: Sequence[int], sharding: HloSharding | None, mesh: Mesh) -> TensorSplit:
    rank = len(dims)
    named = dim_axes(sharding, rank, mesh)
    tiled = sharding is not None and sharding.is_tiled and sharding.tile_assignment is not None
    counts = list(sharding.tile_assignment.dims[:rank]) if tiled else [1] * rank  # type: ignore[union-attr]
    counts += [1] * (rank - len(counts))
    split = tuple(
        DimSplit(size, axes if axes or count == 1 else (f"x{count}",)) for size, axes, count in zip(dims, named, counts)
    )
    used = {a for d in split for a in d.axes}
    shard = tuple(-(-size // count) for size, count in zip(dims, counts))
    replicated = tuple(a for a, n in zip(mesh.axis_names, mesh.shape) if a not in used and n > 1)
    return TensorSplit(name, split, shard, replicated)


class DimLike(Protocol):
    @property
    def size(self) -> int: ...
    @property
    def axes(self) -> Sequence[str]: ...


class TensorLike(Protocol):
    """A TensorSplit, or the plan's JSON model of one."""

    @property
    def name(self) -> str: ...
    @property
    def dims(self) -> Sequence[DimLike]: ...
    @property
    def shard_shape(self) -> Sequence[int]: ...
    @property
    def replicated_over(self) -> Sequence[str]: ...


def _cell(d: DimLike) -> str:
    return f"{d.size} {'*'.join(d.axes)}" if d.axes else str(d.size)


def split_row(t: TensorLike, name_width: int = 0) -> str:
    """`while.2384[38]  [ 8 | 1024 tp | 4096 ]  per chip [8,512,4096], replicated over fsdp`."""
    cells = " | ".join(_cell(d) for d in t.dims) or "scalar"
    shard = ",".join(map(str, t.shard_shape))
    copies = f", replicated over {', '.join(t.replicated_over)}" if t.replicated_over else ""
    return f"{t.name.ljust(name_width)}  [ {cells} ]  per chip [{shard}]{copies}"


def split_art(rows: Sequence[tuple[str, TensorLike]]) -> list[str]:
    """Rows led by a short label (`now`, `planned`, `.`, `->`), names aligned."""
    label_width = max((len(label) for label, _ in rows), default=0)
    name_width = max((len(t.name) for _, t in rows), default=0)
    return [f"{label.rjust(label_width)} {split_row(t, name_width)}" for label, t in rows]

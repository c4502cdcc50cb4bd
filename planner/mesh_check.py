"""Does the mesh the user named fit the shardings the module carries? A warning when it looks swapped.

Each mesh axis splits the devices into classes: devices with the same coordinate along it. A
tensor dim split over an axis (or over several, major to minor) splits the devices into the same
classes: the devices holding the same slice of that dim. So every tiled dim of every annotated
entry parameter must match the classes of some set of the mesh's axes. Worked example: mesh
fsdp=4,tp=2 over devices 0..7 puts device d at fsdp d // 2 and tp d % 2; a weight sharded
`{devices=[4,2]<=[8]}` has dim 0's slices held by {0,1}, {2,3}, {4,5}, {6,7} (the fsdp classes) and
dim 1's by {0,2,4,6}, {1,3,5,7} (the tp classes). Given `--mesh tp=2,fsdp=4` instead, tp is the
major axis and its classes are {0..3}, {4..7}: dim 1 matches no axis, and the swapped order does.

The check is conservative: it warns only when the given mesh leaves some dim unexplained and the
same axes in another order, or with their sizes exchanged, explain every dim; or, when none of those
does, a mesh of as few axes as can be, over the same devices, explains every dim: that mesh is what
the shardings imply. Worked example: `--mesh fsdp=8` on the weights above explains neither dim (its
one axis puts each device in a class of its own), and of the meshes of 8 devices, 4x2 is the one
with fewest axes whose classes are {0,1}, {2,3}, ... and {0,2,4,6}, {1,3,5,7}: `fsdp=4,tp=2`.
"""

from __future__ import annotations

import itertools
import math

from planner.hlo.ir.module import HloModule
from planner.mesh import Mesh
from planner.sharding.hlo_sharding import Kind

Partition = frozenset[frozenset[int]]


def _dim_partitions(module: HloModule) -> set[Partition]:
    """For each tiled data dim of each annotated entry parameter, the devices grouped by the slice they hold."""
    found: set[Partition] = set()
    for inst in module.entry.instructions:
        sharding = inst.sharding
        if inst.opcode != "parameter" or sharding is None or sharding.kind is not Kind.TILED:
            continue
        tiles = sharding.tile_assignment
        assert tiles is not None
        array = tiles.array()
        for dim in range(sharding.tiled_data_rank):
            if array.shape[dim] == 1:
                continue
            classes = [frozenset(int(d) for d in array.take(i, axis=dim).ravel()) for i in range(array.shape[dim])]
            found.add(frozenset(classes))
    return found


def _axis_partitions(mesh: Mesh) -> set[Partition]:
    """The device classes of every set of the mesh's axes."""
    coords = {d: divmod_coords(i, mesh.shape) for i, d in enumerate(mesh.device_ids)}
    partitions: set[Partition] = set()
    for r in range(1, len(mesh.shape) + 1):
        for axes in itertools.combinations(range(len(mesh.shape)), r):
            classes: dict[tuple[int, ...], set[int]] = {}
            for device, c in coords.items():
                classes.setdefault(tuple(c[a] for a in axes), set()).add(device)
            partitions.add(frozenset(frozenset(v) for v in classes.values()))
    return partitions


def divmod_coords(index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major coordinates of position `index` in an array of `shape`."""
    out = []
    for size in reversed(shape):
        index, c = divmod(index, size)
        out.append(c)
    return tuple(reversed(out))


def _unexplained(dims: set[Partition], mesh: Mesh) -> int:
    axes = _axis_partitions(mesh)
    return sum(1 for d in dims if d not in axes)


def mesh_warnings(module: HloModule, mesh: Mesh | None) -> list[str]:
    """A warning when the module's shardings fit the mesh's axes in another order or with exchanged sizes,
    or else fit another mesh over the same devices, named."""
    if mesh is None or math.prod(mesh.shape) != len(mesh.device_ids):
        return []
    dims = _dim_partitions(module)
    if not dims or _unexplained(dims, mesh) == 0:
        return []
    given = mesh.to_text()
    swapped = _swapped(dims, mesh)
    if swapped:
        return swapped
    implied = _implied(dims, mesh)
    if implied is None:
        return []
    sizes = " x ".join(str(n) for n in implied.shape)
    return [
        f"mesh {given} does not fit the module's parameter shardings: they split the {len(mesh.device_ids)} "
        f"devices {sizes} (major to minor), as mesh {implied.to_text()} does; pass that --mesh (naming its axes "
        "as the step does) or shard the step for the mesh you meant"
    ]


# Axis names for a suggested mesh with more axes than the one given: the given names first, then these.
_SPARE_NAMES = ("fsdp", "tp", "data", "seq", "expert", "stage")
_MAX_AXES = 4


def _implied(dims: set[Partition], mesh: Mesh) -> Mesh | None:
    """The mesh of fewest axes (then the first in order of sizes, major to minor) over `mesh`'s devices
    whose axes explain every sharded dim; None when no mesh of up to four axes does."""
    n = len(mesh.device_ids)
    for num_axes in range(1, _MAX_AXES + 1):
        names = (*mesh.axis_names, *(a for a in _SPARE_NAMES if a not in mesh.axis_names))[:num_axes]
        for sizes in _factorizations(n, num_axes):
            candidate = Mesh(sizes, names, mesh.device_ids)
            if _unexplained(dims, candidate) == 0:
                return candidate
    return None


def _factorizations(n: int, num_factors: int) -> list[tuple[int, ...]]:
    """Every ordered way of writing `n` as a product of `num_factors` factors of at least 2, largest first."""
    if num_factors == 1:
        return [(n,)] if n >= 2 else []
    found = []
    for first in range(n // 2, 1, -1):
        if n % first == 0:
            found += [(first, *rest) for rest in _factorizations(n // first, num_factors - 1)]
    return found


def _swapped(dims: set[Partition], mesh: Mesh) -> list[str]:
    """The warning for a mesh whose axes, in another order or with their sizes exchanged, fit every dim."""
    if len(mesh.shape) < 2:
        return []
    given = mesh.to_text()
    # Each axis keeping its size in another order first (a swapped order), then the sizes exchanged.
    reordered = [Mesh(tuple(mesh.shape[i] for i in order), tuple(mesh.axis_names[i] for i in order), mesh.device_ids)
                 for order in itertools.permutations(range(len(mesh.shape)))]  # fmt: skip
    resized = [
        Mesh(sizes, mesh.axis_names, mesh.device_ids) for sizes in sorted(set(itertools.permutations(mesh.shape)))
    ]
    # Shardings tell axes apart by size and order only, not by name: every fitting candidate is named.
    fitting = list(dict.fromkeys(c.to_text() for c in reordered + resized
                                 if c.to_text() != given and _unexplained(dims, c) == 0))  # fmt: skip
    if not fitting:
        return []
    return [
        f"mesh {given} does not fit the module's parameter shardings; {' or '.join(fitting)} would: check the "
        "axis order (major to minor) and sizes"
    ]

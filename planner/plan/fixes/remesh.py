"""A module's shardings laid out again over another mesh: an axis grown, or a new axis added.

A sharding a framework writes over a named mesh (JAX's NamedSharding, torch_xla's mark_sharding) is
the mesh's device array, transposed and reshaped: each tile dim spans some mesh axes, major to
minor, and the axes that split no dim fill the replication dim. Read in those terms, the sharding
can be written again over a mesh whose axes have other sizes, and propagation run again.

Worked example on the mesh fsdp=4,tp=2 (device 2*i + j at fsdp=i, tp=j). `{devices=[1,4,2]<=[8]}`
spans no axis on dim 0, fsdp on dim 1 and tp on dim 2; over fsdp=8,tp=2 it is `{devices=[1,8,2]<=[16]}`.
`{devices=[2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}` spans tp on dim 0 and fsdp on the
replication dim; over fsdp=8,tp=2 it is `{devices=[2,1,8]<=[8,2]T(1,0) last_tile_dim_replicate}`.
A mesh axis the old mesh lacks joins the replication dim, unless it is put on a dim: that is how
`splits` divides one dim of chosen instructions further (the batch of the step's inputs).

A sharding that is no layout of mesh axes (a device order no axis order gives, one axis split over
two dims) is refused with the instruction's name: the moved module would be a guess.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import numpy as np

from planner.hlo.ir.frontend_attributes import MESHES, FrontendAttributes
from planner.hlo.ir.module import Attribute, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.mesh import Mesh
from planner.sharding.hlo_sharding import HloSharding, Kind
from planner.sharding.tile_assignment import TileAssignment

# Each tile dim's mesh axes, major to minor: data dims first, then replication/subgroup dims.
Layout = tuple[tuple[str, ...], ...]
# Attributes that name devices outside the sharding: collectives already partitioned by hand.
_DEVICE_ATTRIBUTES = ("replica_groups", "source_target_pairs")


def axis_layout(sharding: HloSharding, mesh: Mesh) -> Layout | None:
    """The mesh axes each tile dim of a tiled sharding spans, or None when it is no layout of `mesh`'s axes."""
    return _axis_layout(sharding, mesh)


@functools.lru_cache(maxsize=4096)
def _axis_layout(sharding: HloSharding, mesh: Mesh) -> Layout | None:
    tiles = sharding.tile_assignment
    if tiles is None or tiles.num_devices != mesh.num_devices:
        return None
    position = {device: i for i, device in enumerate(mesh.device_ids)}
    if any(d not in position for d in tiles.flat_devices):
        return None
    flat_positions = np.array([position[d] for d in tiles.flat_devices])
    coords = np.stack(np.unravel_index(flat_positions, mesh.shape), axis=-1).reshape(*tiles.dims, len(mesh.shape))
    layout: list[tuple[str, ...]] = []
    for k, count in enumerate(tiles.dims):
        if count == 1:
            layout.append(())
            continue
        varying = [a for a in range(len(mesh.shape)) if np.any(np.diff(coords[..., a], axis=k))]
        index = np.indices(tiles.dims)[k]
        found = None
        for order in itertools.permutations(varying):
            if math.prod(mesh.shape[a] for a in order) != count:
                continue
            radix = np.zeros(tiles.dims, dtype=np.int64)
            for a in order:
                radix = radix * mesh.shape[a] + coords[..., a]
            if np.array_equal(radix, index):
                found = tuple(mesh.axis_names[a] for a in order)
                break
        if found is None:
            return None
        layout.append(found)
    result = tuple(layout)
    # The layout must give the sharding back over its own mesh (replication groups compare as sets).
    rebuilt = _build(result, mesh, sharding.replicate_on_last_tile_dim, sharding.subgroup_types, sharding)
    return result if rebuilt == sharding else None


def _build(layout: Layout, mesh: Mesh, replicate_last: bool, types: tuple[str, ...], like: HloSharding) -> HloSharding:
    """The tiling `layout` gives over `mesh`, replicated on its last dim or with subgroup `types`,
    carrying `like`'s metadata and shard group."""
    size = dict(zip(mesh.axis_names, mesh.shape))
    order = [a for axes in layout for a in axes]
    rest = [a for a in mesh.axis_names if a not in order]
    if any(size[a] > 1 for a in rest):
        raise ValueError(f"mesh axes {rest} of {mesh.to_text()} are on no tile dim of {like.to_text()}")
    perm = tuple(mesh.axis_names.index(a) for a in order + rest)
    dims = tuple(math.prod(size[a] for a in axes) for axes in layout)
    if mesh.device_ids == tuple(range(mesh.num_devices)):
        tiles = TileAssignment.from_iota(dims, mesh.shape, perm)
    else:
        devices = np.array(mesh.device_ids).reshape(mesh.shape).transpose(perm)
        tiles = TileAssignment.from_devices(devices.reshape(-1), dims)
    if replicate_last:
        built = HloSharding.partial_tile(tiles, like.metadata)
    elif types:
        built = HloSharding.subgroup(tiles, types, like.metadata)
    else:
        built = HloSharding.tile(tiles, like.metadata)
    return built.with_shard_group(like.shard_group)


def move_sharding(
    sharding: HloSharding, old: Mesh, new: Mesh, split: tuple[int, str] | None = None, rank: int | None = None
) -> HloSharding:
    """`sharding` over `new`: each tile dim keeps its axes, at their sizes in `new`.

    Axes `new` has and `old` lacks join the replication dim, or with `split=(dim, axis)` that data
    dim, as its minor-most axis (a replicated sharding is split too: give the array's `rank`).
    """
    if sharding.kind is Kind.TUPLE:
        return HloSharding.tuple_of(tuple(move_sharding(e, old, new) for e in sharding.elements))
    if sharding.kind is Kind.MAXIMAL and sharding.device is not None and sharding.device >= new.num_devices:
        raise ValueError(f"{sharding.to_text()} names a device the mesh {new.to_text()} does not have")
    if sharding.kind is not Kind.TILED:
        if split is None or sharding.kind is not Kind.REPLICATED:
            return sharding
        if rank is None or split[0] >= rank:
            raise ValueError(f"cannot split dim {split[0]} of a rank-{rank} array")
        dim, axis = split
        alone: Layout = tuple((axis,) if d == dim else () for d in range(rank))
        return _build(alone + (tuple(a for a in new.axis_names if a != axis),), new, True, (), sharding)
    found = axis_layout(sharding, old)
    if found is None:
        raise ValueError(f"{sharding.to_text()} is not a layout of the mesh axes of {old.to_text()}")
    layout = found
    data_rank, types = sharding.tiled_data_rank, sharding.subgroup_types
    if split is not None:
        dim, axis = split
        if dim >= data_rank:
            raise ValueError(f"cannot split dim {dim} of {sharding.to_text()}: it tiles {data_rank} dims")
        layout = tuple(axes + (axis,) if d == dim else axes for d, axes in enumerate(layout))
    placed = {a for axes in layout for a in axes}
    extra = tuple(a for a in new.axis_names if a not in placed and a not in old.axis_names)
    replicate_last = sharding.replicate_on_last_tile_dim
    if extra:
        if replicate_last:
            layout = layout[:-1] + (layout[-1] + extra,)
        elif "replicated" in types:
            at = data_rank + types.index("replicated")
            layout = tuple(axes + extra if d == at else axes for d, axes in enumerate(layout))
        else:
            # A replication dim of its own: a full tiling becomes a partial one.
            layout += (extra,)
            replicate_last, types = not types, (types + ("replicated",) if types else ())
    return _build(layout, new, replicate_last, types, sharding)


def remesh_module(
    module: HloModule, old: Mesh, new: Mesh, splits: dict[str, tuple[int, str]] | None = None
) -> HloModule:
    """`module` with every sharding moved from `old` to `new` (see `move_sharding`) and num_partitions updated.

    `splits` names instructions whose data dim is split further over a new axis: {name: (dim, axis)}.
    """
    splits = splits or {}
    unknown_axes = {a for _, a in splits.values()} - set(new.axis_names)
    if unknown_axes:
        raise ValueError(f"splits name axes {sorted(unknown_axes)} the mesh {new.to_text()} does not have")
    missing = set(splits)
    comps = []
    for comp in module.computations:
        out: list[Instruction] = []
        for inst in comp.instructions:
            for key in _DEVICE_ATTRIBUTES:
                if inst.has_attr(key):
                    raise ValueError(
                        f"{inst.name} ({inst.opcode}) names devices in {key}: it cannot move to a new mesh"
                    )
            sharding = inst.sharding
            if sharding is not None:
                missing.discard(inst.name)
                try:
                    moved = move_sharding(sharding, old, new, splits.get(inst.name), _rank(inst))
                except ValueError as e:
                    raise ValueError(f"{inst.name}: {e}") from None
                inst = _with_sharding(inst, moved)
            elif inst.name in splits:
                missing.discard(inst.name)
                moved = move_sharding(HloSharding.replicate(), old, new, splits[inst.name], _rank(inst))
                inst = dataclasses.replace(
                    inst, attributes=(*inst.attributes, Attribute("sharding", moved, moved.to_text()))
                )
            out.append(inst)
        comps.append(dataclasses.replace(comp, instructions=tuple(out)))
    if missing:
        raise ValueError(f"splits name {sorted(missing)}, not instructions of {module.name}")
    count = new.num_devices
    attributes = tuple(_moved_header(a, count) for a in module.attributes)
    return dataclasses.replace(module, computations=tuple(comps), attributes=attributes)


def _moved_header(a: Attribute, num_devices: int) -> Attribute:
    """num_partitions counts the new mesh; a Shardy mesh declaration goes (the shardings are GSPMD's now)."""
    if a.key == "num_partitions":
        return Attribute("num_partitions", num_devices, str(num_devices))
    if a.key == "frontend_attributes" and isinstance(a.value, FrontendAttributes) and a.value.sdy_meshes:
        kept = tuple((k, v) for k, v in a.value.items if k != MESHES)
        text = "{" + ", ".join(f'{k}="{v}"' for k, v in kept) + "}"
        return Attribute(a.key, FrontendAttributes(kept), text)
    return a


def _with_sharding(inst: Instruction, sharding: HloSharding) -> Instruction:
    attributes = tuple(
        Attribute("sharding", sharding, sharding.to_text()) if a.key == "sharding" else a for a in inst.attributes
    )
    return dataclasses.replace(inst, attributes=attributes)


def _rank(inst: Instruction) -> int | None:
    shape = inst.shape
    return shape.rank if isinstance(shape, ArrayShape) else None

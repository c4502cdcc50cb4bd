"""Partition specs (per dim: a mesh axis name, several, or none) and the HloShardings they mean on a mesh.

Worked example: on mesh fsdp=4,tp=2 (devices 0..7 row-major), `[None, 'fsdp', 'tp']` for a rank-3 array is
`{devices=[1,4,2]<=[8]}`, and `['tp', 'fsdp']` for a rank-2 one is `{devices=[2,4]<=[4,2]T(1,0)}`.
`spec_from_sharding` goes back from the sharding to the spec.
"""

from __future__ import annotations

import itertools

import numpy as np

from planner.mesh import Mesh
from planner.sharding.hlo_sharding import HloSharding
from planner.sharding.text import parse_sharding

AxisSpec = str | list[str] | None


def spec_axes(spec: AxisSpec) -> tuple[str, ...]:
    if spec is None:
        return ()
    return (spec,) if isinstance(spec, str) else tuple(spec)


def spec_sharding(spec: list[AxisSpec], mesh: Mesh) -> HloSharding:
    """The HloSharding a partition spec means on `mesh`."""
    used = [axis for dim in spec for axis in spec_axes(dim)]
    unknown = [a for a in used if a not in mesh.axis_names]
    if unknown:
        raise ValueError(f"partition_spec={spec} names {unknown}, not axes of mesh {mesh.to_text()}")
    if len(set(used)) != len(used):
        raise ValueError(f"partition_spec={spec} uses a mesh axis twice")
    position = {name: i for i, name in enumerate(mesh.axis_names)}
    rest = [a for a in mesh.axis_names if a not in used]
    devices = np.array(mesh.device_ids).reshape(mesh.shape)
    devices = devices.transpose([position[a] for a in used + rest])
    tile_dims = [int(np.prod([mesh.shape[position[a]] for a in spec_axes(dim)])) for dim in spec]
    replicated = int(np.prod([mesh.shape[position[a]] for a in rest]))
    if all(n == 1 for n in tile_dims):
        return HloSharding.replicate()
    dims = tile_dims + ([replicated] if replicated > 1 else [])
    ids = ",".join(str(int(d)) for d in devices.reshape(-1))
    suffix = " last_tile_dim_replicate" if replicated > 1 else ""
    return parse_sharding(f"{{devices=[{','.join(map(str, dims))}]{ids}{suffix}}}")


def spec_from_sharding(sharding: HloSharding, rank: int, mesh: Mesh) -> list[AxisSpec]:
    """The partition spec over `mesh` whose sharding is `sharding` (what a framework reports per tensor).

    Searches the ways to give each mesh axis to one dim (or none), in every
    order within a dim; meshes have a handful of axes, so the search is small.
    """
    if not sharding.is_tiled:
        if sharding.is_replicated:
            return [None] * rank
        raise ValueError(f"sharding {sharding.to_text()} is not a tiling of mesh {mesh.to_text()}")
    axes = list(mesh.axis_names)
    for owners in itertools.product(range(rank + 1), repeat=len(axes)):
        per_dim = [[a for a, o in zip(axes, owners) if o == d] for d in range(rank)]
        for orders in itertools.product(*(itertools.permutations(group) for group in per_dim)):
            spec: list[AxisSpec] = [None if not g else g[0] if len(g) == 1 else list(g) for g in orders]
            if spec_sharding(spec, mesh) == sharding:
                return spec
    raise ValueError(f"sharding {sharding.to_text()} is not a partition spec over mesh {mesh.to_text()}")

"""The client manifest: which output is whose gradient, and each parameter's partition spec.

A training framework knows what HLO does not say: that output 12 is the
gradient of `3.d.weight`, and that `3.d.weight` was annotated
`('fsdp', 'tp')`. With it, a stacked gradient's ideal is exact and the plan
can speak the framework's vocabulary (pin `d.weight` inside the scanned body).

A partition spec names, per tensor dim, the mesh axes it is split over
(`None` for none), as `jax.sharding.PartitionSpec` and torch_xla's
`mark_sharding` do. Worked example on the mesh `fsdp=4,tp=2` (device
2*i + j at fsdp=i, tp=j): spec `('tp', 'fsdp')` splits dim 0 two ways along
tp and dim 1 four ways along fsdp. The tile holding rows block r and column
block c is on the device with tp=r, fsdp=c, i.e. device 2*c + r, so the
device array is the mesh transposed, `[[0,2,4,6],[1,3,5,7]]`:
`{devices=[2,4]0,2,4,6,1,3,5,7}`. Mesh axes the spec leaves out replicate:
spec `('fsdp', None)` is `{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}`.
"""

from __future__ import annotations

import itertools
import re

import numpy as np
from pydantic import BaseModel, Field, field_validator

from planner.mesh import Mesh
from planner.sharding.hlo_sharding import HloSharding
from planner.sharding.text import parse_sharding

AxisSpec = str | list[str] | None


class ManifestParameter(BaseModel):
    name: str = Field(description="the framework's parameter name, e.g. `3.d.weight`")
    shape: list[int]
    partition_spec: list[AxisSpec] = Field(description="per dim: a mesh axis name, a list of them, or null")

    @field_validator("shape")
    @classmethod
    def _positive(cls, shape: list[int]) -> list[int]:
        if any(n < 0 for n in shape):
            raise ValueError(f"shape={shape} has a negative dim")
        return shape


class Manifest(BaseModel):
    outputs: list[str | None] = Field(
        description="per entry output, in order: the name of the parameter whose gradient it is, or null"
    )
    parameters: list[ManifestParameter]

    def parameter(self, name: str) -> ManifestParameter:
        for p in self.parameters:
            if p.name == name:
                return p
        raise ValueError(f"manifest output names parameter {name!r}, which the manifest's parameters do not list")


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


_LAYER_INDEX = re.compile(r"^(?:.*?\.)?\d+\.(.+)$")


def layer_relative(name: str) -> str:
    """`layers.3.mlp.down.weight` -> `mlp.down.weight`: the name inside the scanned layer."""
    m = _LAYER_INDEX.match(name)
    return m.group(1) if m else name


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

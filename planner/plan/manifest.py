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

import re

from pydantic import BaseModel, Field, field_validator

from planner.sharding.partition_spec import AxisSpec


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
    left_out: str | None = Field(
        default=None,
        description="what of the step that trains the captured module leaves out (e.g. `the optimizer's update`); "
        "null when it is the whole step. What a placement saves on a partial step is not what it saves on the "
        "step that trains, so a plan of one recommends none.",
    )

    def parameter(self, name: str) -> ManifestParameter:
        for p in self.parameters:
            if p.name == name:
                return p
        raise ValueError(f"manifest output names parameter {name!r}, which the manifest's parameters do not list")


_LAYER_INDEX = re.compile(r"^(?:.*?\.)?\d+\.(.+)$")


def layer_relative(name: str) -> str:
    """`layers.3.mlp.down.weight` -> `mlp.down.weight`: the name inside the scanned layer."""
    m = _LAYER_INDEX.match(name)
    return m.group(1) if m else name

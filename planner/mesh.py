"""A device mesh: named axes over device ids.

`Mesh.parse("fsdp=4,tp=2")` is the 4x2 mesh whose devices are 0..7 in
row-major order: device 2*i + j sits at fsdp=i, tp=j, matching
`{devices=[4,2]<=[8]}`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

_AXIS = re.compile(r"\s*([A-Za-z_]\w*)\s*=\s*(\d+)\s*")
# Far above the largest slices (v5p: 8,960 chips) and their multislice combinations; a mesh above it is a
# typo, and its device list alone would not fit in memory.
MAX_DEVICES = 1 << 20


@dataclass(frozen=True, slots=True)
class Mesh:
    shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    device_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.axis_names):
            raise ValueError(f"mesh shape={self.shape} does not match axis_names={self.axis_names}")
        if any(n < 1 for n in self.shape):
            raise ValueError(f"mesh shape={self.shape} must be positive")
        if len(set(self.axis_names)) != len(self.axis_names):
            raise ValueError(f"mesh axis_names={self.axis_names} repeat a name")
        if math.prod(self.shape) > MAX_DEVICES:
            raise ValueError(f"mesh shape={self.shape} has {math.prod(self.shape):,} devices, more than the "
                             f"{MAX_DEVICES:,} the planner reads")  # fmt: skip
        ids = self.device_ids or tuple(range(math.prod(self.shape)))
        if len(ids) != math.prod(self.shape) or len(set(ids)) != len(ids) or min(ids) < 0:
            raise ValueError(f"device_ids={self.device_ids} must be {math.prod(self.shape)} distinct ids >= 0")
        object.__setattr__(self, "device_ids", tuple(ids))

    @property
    def num_devices(self) -> int:
        return math.prod(self.shape)

    @staticmethod
    def parse(text: str) -> Mesh:
        """`fsdp=4,tp=2` (axis=size pairs, major to minor)."""
        names, sizes = [], []
        for part in text.split(","):
            m = _AXIS.fullmatch(part)
            if m is None:
                raise ValueError(f"bad mesh axis {part!r} in {text!r}: expected name=size, e.g. fsdp=4,tp=2")
            names.append(m.group(1))
            sizes.append(int(m.group(2)))
        return Mesh(tuple(sizes), tuple(names))

    def to_text(self) -> str:
        return ",".join(f"{n}={s}" for n, s in zip(self.axis_names, self.shape))


def to_planner_mesh(mesh: Any) -> Mesh:
    """A torch_xla `Mesh`, a `jax.sharding.Mesh` (or the planner's own) as the planner's `Mesh`."""
    import numpy as np

    if isinstance(mesh, Mesh):
        return mesh
    if not hasattr(mesh, "mesh_shape") and hasattr(mesh, "devices"):
        # JAX: jit assigns the mesh's devices in order, so the module's device ids are positions in it.
        return Mesh(tuple(int(n) for n in mesh.devices.shape), tuple(str(a) for a in mesh.axis_names))
    names = tuple(mesh.axis_names) if mesh.axis_names else tuple(f"axis{i}" for i in range(len(mesh.mesh_shape)))
    devices = np.asarray(mesh.device_ids).reshape(-1)
    return Mesh(tuple(int(n) for n in mesh.mesh_shape), names, tuple(int(d) for d in devices))

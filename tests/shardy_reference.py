"""Writes JAX-lowered Shardy modules whose parameters carry both sharding forms (run in a subprocess).

    python tests/shardy_reference.py OUT.json

JAX 0.7.1 lowers each `NamedSharding` as Shardy's `xla.sdy.sharding` and, beside
it, as the HloSharding XLA's Shardy export computes: the reference for our
conversion. Meshes of one to three axes over 8 devices; per mesh, six
parameters with seeded specs (one, two or no axes per dim).
"""

from __future__ import annotations

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESHES = [((8,), ("x",)), ((4, 2), ("a", "b")), ((2, 4), ("a", "b")), ((2, 2, 2), ("a", "b", "c"))]


def specs(names: tuple[str, ...], rng: np.random.Generator, count: int) -> list[P]:
    out = []
    for _ in range(count):
        free = list(names)
        rng.shuffle(free)
        dims = []
        for _ in range(3):
            k = int(rng.integers(0, 3))
            take, free = free[:k], free[k:]
            dims.append(tuple(take) if len(take) > 1 else (take[0] if take else None))
        out.append(P(*dims))
    return out


def main() -> int:
    jax.config.update("jax_use_shardy_partitioner", True)
    rng = np.random.default_rng(0)
    texts = []
    for shape, names in MESHES:
        mesh = Mesh(np.array(jax.devices()).reshape(shape), names)
        args = [
            jax.ShapeDtypeStruct((16, 16, 16), jnp.float32, sharding=NamedSharding(mesh, s))
            for s in specs(names, rng, 6)
        ]
        texts.append(jax.jit(lambda *xs: [x * 2 for x in xs]).lower(*args).as_text(dialect="hlo"))
    with open(sys.argv[1], "w") as f:
        json.dump(texts, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

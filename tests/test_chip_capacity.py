"""Each TPU preset holds what XLA:TPU lets one program hold on that chip: a step 1 MiB under the preset
compiles ahead of time, one 1 MiB over it is refused with XLA:TPU's compile-time out-of-memory error.

The step is one f32 argument and one output of its size (`a * 2`): its total (argument + output + temp -
alias) is twice the argument. Today's libtpu only (listed in the Makefile's JAX_TODAY_TESTS): the edge
moves with libtpu (0.0.20 offers a v6e program 31.25 GiB, 0.0.50 31.24 GiB).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata

import pytest

from planner.memory.chips import chip

pytestmark = pytest.mark.xla

MIB = 1 << 20
ROW_BYTES = 4096 * 4  # one f32[4096] row
TOPOLOGIES = {"v6e": "v6e:2x2", "v5e": "v5e:2x2", "v5p": "v5p:2x2x1"}

_COMPILE = """
import json, os, sys
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import topologies
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
topology, rows = sys.argv[1], int(sys.argv[2])
device = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices[0]
step = jax.ShapeDtypeStruct((rows, 4096), jnp.float32, sharding=NamedSharding(Mesh(np.array([device]), ("x",)), P()))
try:
    stats = jax.jit(lambda a: a * 2).lower(step).compile().memory_analysis()
    total = (stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
             - stats.alias_size_in_bytes)
    print(json.dumps({"total_bytes": total}))
except Exception as e:
    print(json.dumps({"refused": str(e).splitlines()[0]}))
"""


def _libtpu() -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in metadata.version("libtpu").split(".")[:3])
    except (metadata.PackageNotFoundError, ValueError):
        return ()


def _compile(topology: str, rows: int) -> dict[str, object]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", _COMPILE, topology, str(rows)], env=env, capture_output=True,
                         text=True, timeout=600, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.skipif(_libtpu() < (0, 0, 50), reason="the presets are today's libtpu's edge (>= 0.0.50)")
@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_a_tpu_preset_is_the_most_xla_tpu_lets_one_program_hold(name: str) -> None:
    capacity = chip(name).hbm_bytes
    under = _compile(TOPOLOGIES[name], (capacity - MIB) // 2 // ROW_BYTES)
    assert capacity - 2 * MIB <= int(under["total_bytes"]) <= capacity - MIB, under  # type: ignore[call-overload]
    over = _compile(TOPOLOGIES[name], -(-(capacity + MIB) // 2 // ROW_BYTES))
    assert "CompileTimeHbmOom" in str(over.get("refused")), over

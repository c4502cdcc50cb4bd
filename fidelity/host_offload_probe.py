"""Host offload against XLA:TPU: a scanned step whose remat policy offloads each layer's activation to host
memory, compiled ahead of time, its host and HBM bytes beside the planner's.

    python -m fidelity.host_offload_probe [--topology v6e:2x2] [--layers L] [--tokens T] [--width D]

The step is a scan of `L` layers, `h = tanh(x @ w)` each, under `jax.checkpoint` with
`save_and_offload_only_these_names` offloading `h` (`offload_dst="pinned_host"`, what MaxText's
`*_offloaded` remat policies write), its gradient taken, the tokens split over the topology's devices.
XLA:TPU compiles it for the topology with no TPU attached; its `memory_analysis()` gives the host bytes
(`host_temp_size_in_bytes`) and its buffer assignment the HBM. The planner plans the lowered HLO text for
the chip. Prints one JSON object: {"layers", "xla_host", "planned_host", "xla_hbm", "planned_hbm"}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any


def _step(layers: int) -> Any:
    import jax
    import jax.numpy as jnp
    from jax.ad_checkpoint import checkpoint_name

    policy = jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[],
        names_which_can_be_offloaded=["h"],
        offload_src="device",
        offload_dst="pinned_host",
    )

    def layer(x: Any, w: Any) -> tuple[Any, None]:
        h = checkpoint_name(jnp.tanh(x @ w), "h")
        return jnp.tanh(h @ w.T) + x, None

    def loss(ws: Any, x: Any) -> Any:
        y, _ = jax.lax.scan(jax.checkpoint(layer, policy=policy), x, ws)
        return jnp.mean(y.astype(jnp.float32) ** 2)

    del layers
    return jax.jit(jax.grad(loss))


def probe(topology: str = "v6e:2x2", layers: int = 8, tokens: int = 4096, width: int = 1024) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from fidelity.memory_stats import HOST_FIELDS
    from planner import parse_hlo
    from planner.memory import memory_report
    from planner.plan.compilers.xla_compile import hbm_allocated_bytes
    from planner.prepare import prepare
    from planner.propagation import propagate

    devices = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
    mesh = Mesh(np.array(devices), ("data",))
    ws = jax.ShapeDtypeStruct((layers, width, width), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec()))
    x = jax.ShapeDtypeStruct((tokens, width), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec("data")))
    lowered = _step(layers).lower(ws, x)
    dump = Path(tempfile.mkdtemp(prefix="host-offload-"))
    try:
        compiled = lowered.compile({"xla_dump_to": str(dump), "xla_dump_hlo_pass_re": "^$"})
        stats = compiled.memory_analysis()
        assignment = sorted(dump.glob("*buffer-assignment.txt"), key=lambda p: p.stat().st_size)[-1]
        xla_hbm = hbm_allocated_bytes(assignment.read_text())
    finally:
        shutil.rmtree(dump, ignore_errors=True)
    chip = topology.split(":")[0]
    prepared = prepare(parse_hlo(lowered.as_text(dialect="hlo")), chip)
    report = memory_report(prepared, result=propagate(prepared))
    return {
        "layers": layers,
        "xla_host": sum(int(getattr(stats, k, 0) or 0) for k in HOST_FIELDS),
        "planned_host": report.host_bytes,
        "xla_hbm": xla_hbm,
        "planned_hbm": report.total_bytes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fidelity.host_offload_probe")
    parser.add_argument("--topology", default="v6e:2x2")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--width", type=int, default=1024)
    args = parser.parse_args(argv)
    # libtpu loads once per machine unless told otherwise: the test suites run beside other compiles.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    print(json.dumps(probe(args.topology, args.layers, args.tokens, args.width)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

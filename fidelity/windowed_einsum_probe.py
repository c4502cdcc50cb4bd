"""Where libtpu starts making an FSDP dot a windowed einsum: compile FSDP dots ahead of time and look.

    python -m fidelity.windowed_einsum_probe TOPOLOGY FSDP [--tp N] [--kind ag|rs] [--dtype bf16|f32]
                                             [--tokens T ...]

Each probe is one dot on a `fsdp x tp` mesh of the topology's devices: activations `x[T * fsdp, D]`
split on the tokens over `fsdp`, and either the forward dot with a weight `W[D, F]` split `(fsdp, tp)`
(`ag`: the weight is all-gathered over `fsdp`) or the weight gradient `x^T . dy` returned split
`(fsdp, tp)` (`rs`: the partial sums are reduce-scattered over `fsdp`). XLA:TPU compiles it for the
topology with no TPU attached; the probe reports whether its optimized module holds a
`windowed_dot_general` loop. With no `--tokens` it bisects the tokens per device `T` at which the loop
first appears: the threshold `planner.targets.WINDOWED_EINSUM_FLOPS_PER_BYTE` records (for bf16 the
dot's FLOPs per byte of its collective equal T; f32 halves the ratio).

Prints one JSON object per line: {"tokens": T, "windowed": bool} per probe, or {"threshold": [lo, hi]}
(not windowed at lo tokens per device, windowed at hi), or {"threshold": null} when no size up to
65,536 tokens per device is windowed.
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

D = 1024
F_PER_TP = 4096
MAX_TOKENS = 65536


def _compiler(topology: str, fsdp: int, tp: int, kind: str, dtype_name: str, dump: Path) -> Any:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    jax.config.update("jax_use_shardy_partitioner", False)
    devices = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
    mesh = Mesh(np.array(devices[: fsdp * tp]).reshape(fsdp, tp), ("fsdp", "tp"))
    dtype = {"bf16": jnp.bfloat16, "f32": jnp.float32}[dtype_name]

    def split(*spec: str | None) -> NamedSharding:
        return NamedSharding(mesh, P(*spec))

    def windowed(tokens: int) -> bool:
        shutil.rmtree(dump, ignore_errors=True)
        x = jax.ShapeDtypeStruct((tokens * fsdp, D), dtype, sharding=split("fsdp", None))
        if kind == "ag":
            other = jax.ShapeDtypeStruct((D, F_PER_TP * tp), dtype, sharding=split("fsdp", "tp"))
            step = jax.jit(lambda x, w: x @ w, out_shardings=split("fsdp", "tp"))
        else:
            other = jax.ShapeDtypeStruct((tokens * fsdp, F_PER_TP * tp), dtype, sharding=split("fsdp", "tp"))
            step = jax.jit(lambda x, dy: x.T @ dy, out_shardings=split("fsdp", "tp"))
        step.lower(x, other).compile()
        optimized = "".join(p.read_text() for p in dump.glob("*after_optimizations.txt"))
        return "windowed_dot_general" in optimized

    return windowed


def bisect(windowed: Any) -> list[int] | None:
    """(lo, hi]: not windowed at lo tokens per device, windowed at hi, to within 1/32 of lo."""
    lo, hi = 16, MAX_TOKENS
    if not windowed(hi):
        return None
    if windowed(lo):
        return [0, lo]
    while hi - lo > max(8, lo // 32):
        mid = (lo + hi) // 2
        if windowed(mid):
            hi = mid
        else:
            lo = mid
    return [lo, hi]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("topology", help="libtpu's topology name, e.g. v6e:2x4")
    parser.add_argument("fsdp", type=int)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--kind", choices=("ag", "rs"), default="ag")
    parser.add_argument("--dtype", choices=("bf16", "f32"), default="bf16")
    parser.add_argument("--tokens", type=int, action="append", default=[], help="probe these tokens per device")
    args = parser.parse_args(argv)
    dump = Path(tempfile.mkdtemp(prefix="windowed-einsum-probe-"))
    # XLA reads its flags once, at the first compile: set before jax is imported.
    os.environ["XLA_FLAGS"] = f"--xla_dump_to={dump} --xla_dump_hlo_as_text"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        windowed = _compiler(args.topology, args.fsdp, args.tp, args.kind, args.dtype, dump)
        if args.tokens:
            for tokens in args.tokens:
                print(json.dumps({"tokens": tokens, "windowed": windowed(tokens)}), flush=True)
        else:
            print(json.dumps({"threshold": bisect(windowed)}), flush=True)
    finally:
        shutil.rmtree(dump, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

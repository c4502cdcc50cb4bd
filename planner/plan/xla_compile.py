"""Compile one HLO module with real XLA's SPMD pipeline and report what it decided.

Run as a subprocess (`python -m planner.plan.xla_compile`), one module per
process: XLA reads its flags (device count, dump folder) once per process.
Reads `{"hlo": TEXT, "num_devices": N, "allow_output": BOOL}` as JSON on stdin and
prints one JSON line: XLA's version, compiled memory statistics (bytes per
device) and each While's carried tuple per device right after SPMD
partitioning. Needs jaxlib (the `xla` extra); the text goes through StableHLO,
which is the only way jaxlib compiles.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
import tempfile
import time
from typing import Any

_WHILE = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\(.*?\)) while\(")


def compile_spmd(text: str, num_devices: int, allow_output: bool = False) -> tuple[Any, float]:
    """(executable, seconds): text -> HloModule -> StableHLO -> SPMD program for `num_devices` CPU devices.

    XLA reads its device count when jax first starts: set
    `--xla_force_host_platform_device_count` in XLA_FLAGS before calling.
    """
    import jax
    from jax._src import xla_bridge
    from jax._src.lib import xla_client

    jax.config.update("jax_use_shardy_partitioner", False)
    start = time.perf_counter()
    module = xla_client._xla.hlo_module_from_text(text)
    mlir = xla_client._xla.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
    options = xla_client.CompileOptions()
    options.num_replicas = 1
    options.num_partitions = num_devices
    build = options.executable_build_options
    build.num_partitions = num_devices
    build.use_spmd_partitioning = True
    if hasattr(build, "use_shardy_partitioner"):
        build.use_shardy_partitioner = False
    if allow_output:
        build.allow_spmd_sharding_propagation_to_output = [True]
    client = xla_bridge.get_backend()
    devices = xla_client.DeviceList(tuple(jax.devices()[:num_devices]))
    compile_fn = client.compile_and_load if hasattr(client, "compile_and_load") else client.compile
    executable = compile_fn(mlir, devices, options)
    return executable, time.perf_counter() - start


def memory_total(executable: Any) -> int:
    """argument + output + temp - alias bytes per device, from compiled memory stats."""
    stats = executable.get_compiled_memory_stats()
    return int(
        stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes - stats.alias_size_in_bytes
    )


def main() -> int:
    request = json.load(sys.stdin)
    n = int(request["num_devices"])
    dump = tempfile.mkdtemp(prefix="spmd-planner-xla-")
    os.environ["XLA_FLAGS"] = (
        f"--xla_force_host_platform_device_count={n} --xla_dump_to={dump} "
        "--xla_dump_hlo_as_text --xla_dump_hlo_pass_re=spmd-partitioning"
    )
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jaxlib

    executable, seconds = compile_spmd(request["hlo"], n, bool(request.get("allow_output")))
    stats = executable.get_compiled_memory_stats()
    whiles = []
    partitioned = sorted(glob.glob(os.path.join(dump, "*after_spmd-partitioning*.txt")))
    if partitioned:
        with open(partitioned[-1]) as f:
            whiles = [{"name": m.group(1), "shape": m.group(2)} for line in f if (m := _WHILE.match(line))]
    print(json.dumps({
        "xla": f"jaxlib {jaxlib.__version__} (XLA GSPMD on {n} virtual CPU devices)",
        "total_bytes": memory_total(executable),
        "argument_bytes": int(stats.argument_size_in_bytes),
        "output_bytes": int(stats.output_size_in_bytes),
        "temp_bytes": int(stats.temp_size_in_bytes),
        "alias_bytes": int(stats.alias_size_in_bytes),
        "while_shapes": whiles,
        "seconds": round(seconds, 3),
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Real XLA for the benchmarks: jaxlib's SPMD compile of HLO text on virtual CPU devices.

Import this module before anything imports jax: it sets the device count.
"""

from __future__ import annotations

import os
import time

PARTITIONS = 8
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={PARTITIONS}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def compile_spmd(text: str, allow_output: bool = False, partitions: int = PARTITIONS) -> tuple[object, float]:
    """(executable, seconds): text -> HloModule -> StableHLO -> compiled SPMD program."""
    import jax
    from jax._src import xla_bridge
    from jax._src.lib import xla_client

    jax.config.update("jax_use_shardy_partitioner", False)
    start = time.perf_counter()
    module = xla_client._xla.hlo_module_from_text(text)
    mlir = xla_client._xla.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
    options = xla_client.CompileOptions()
    options.num_replicas = 1
    options.num_partitions = partitions
    build = options.executable_build_options
    build.num_partitions = partitions
    build.use_spmd_partitioning = True
    if hasattr(build, "use_shardy_partitioner"):
        build.use_shardy_partitioner = False
    if allow_output:
        build.allow_spmd_sharding_propagation_to_output = [True]
    client = xla_bridge.get_backend()
    devices = xla_client.DeviceList(tuple(jax.devices()[:partitions]))
    compile_fn = client.compile_and_load if hasattr(client, "compile_and_load") else client.compile
    executable = compile_fn(mlir, devices, options)
    return executable, time.perf_counter() - start


def memory_total(executable: object) -> int:
    """argument + output + temp - alias bytes per device, from compiled memory stats."""
    stats = executable.get_compiled_memory_stats()  # type: ignore[attr-defined]
    return int(
        stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes - stats.alias_size_in_bytes
    )


def summary(benchmark: str, case: str, ours: float, xla: float, unit: str, ratio: float, note: str = "") -> None:
    """One headline row, printed as `SUMMARY {json}` for bench/all.py to collect."""
    import json

    row = {"benchmark": benchmark, "case": case, "ours": ours, "xla": xla, "unit": unit, "ratio": ratio, "note": note}
    print("SUMMARY " + json.dumps(row))

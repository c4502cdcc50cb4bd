"""Compile one HLO module with real XLA's SPMD pipeline and report what it decided.

Run as a subprocess (`python -m planner.plan.xla_compile`), one module per
process: XLA reads its flags (device count, dump folder) once per process.
Reads `{"hlo": TEXT, "num_devices": N, "allow_output": BOOL, "tpu_topology": T}`
as JSON on stdin and prints one JSON line: XLA's version, compiled memory
statistics (bytes per device) and each While's carried tuple per device right
after SPMD partitioning. Needs jaxlib (the `xla` extra); the text goes through
StableHLO, which is the only way jaxlib compiles. With `tpu_topology` (e.g.
`v6e:2x4`, needs libtpu from the `tpu` extra) XLA:TPU compiles it ahead of
time for that slice, with no TPU attached: the bytes a user's chip will see.
This is the one place the planner asks a real compiler; the reference sweep's
TPU numbers come from the same libtpu through JAX's ahead-of-time API.
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

import numpy as np

_WHILE = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\(.*?\)) while\(", re.MULTILINE)


def partitioned_whiles(text: str) -> list[dict[str, str]]:
    """Each While of a module XLA dumped right after SPMD partitioning: its name and per-device tuple shape."""
    return [{"name": m.group(1), "shape": m.group(2)} for m in _WHILE.finditer(text)]


def compile_spmd(
    text: str, num_devices: int, allow_output: bool = False, tpu_topology: str | None = None
) -> tuple[Any, float]:
    """(executable, seconds): text -> HloModule -> StableHLO -> SPMD program for `num_devices` devices.

    CPU devices unless `tpu_topology` names a TPU slice libtpu describes. XLA reads its CPU device
    count when jax first starts: set `--xla_force_host_platform_device_count` in XLA_FLAGS first.
    """
    import jax
    from jax._src import compiler, xla_bridge
    from jax._src.lib import xla_client

    jax.config.update("jax_use_shardy_partitioner", False)
    start = time.perf_counter()
    module = xla_client._xla.hlo_module_from_text(text)
    mlir = xla_client._xla.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
    if tpu_topology is not None:
        from jax.experimental import topologies

        slice_devices = topologies.get_topology_desc(platform="tpu", topology_name=tpu_topology).devices
        if len(slice_devices) < num_devices:
            raise ValueError(f"TPU topology {tpu_topology} has {len(slice_devices)} devices, the module {num_devices}")
        chosen = tuple(slice_devices[:num_devices])
        # A compile-only client: the executable is never loaded, only its memory statistics are read.
        client = getattr(chosen[0], "client")  # noqa: B009  (jaxlib types devices loosely)
        compile_fn = client.compile
    else:
        chosen = tuple(jax.devices()[:num_devices])
        client = xla_bridge.get_backend()
        compile_fn = client.compile_and_load if hasattr(client, "compile_and_load") else client.compile
    # The options JAX compiles with, device assignment included: without one XLA:TPU places the
    # partitions on the slice its own way, and schedules (and sizes temporaries) differently.
    options = compiler.get_compile_options(
        num_replicas=1,
        num_partitions=num_devices,
        device_assignment=np.array(chosen).reshape(1, num_devices),
        use_spmd_partitioning=True,
    )
    build = options.executable_build_options
    build.use_shardy_partitioner = False
    if allow_output:
        build.allow_spmd_sharding_propagation_to_output = [True]
    executable = compile_fn(mlir, xla_client.DeviceList(chosen), options)
    return executable, time.perf_counter() - start


def _libtpu_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("libtpu")
    except PackageNotFoundError:
        return "unknown"


def memory_total(executable: Any) -> int:
    """argument + output + temp - alias bytes per device, from compiled memory stats."""
    stats = executable.get_compiled_memory_stats()
    return int(
        stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes - stats.alias_size_in_bytes
    )


def main() -> int:
    request = json.load(sys.stdin)
    with tempfile.TemporaryDirectory(prefix="spmd-planner-xla-") as dump:
        report = _compile_report(request, dump)
    print(json.dumps(report))
    return 0


def _compile_report(request: dict[str, Any], dump: str) -> dict[str, Any]:
    n = int(request["num_devices"])
    os.environ["XLA_FLAGS"] = (
        f"--xla_force_host_platform_device_count={n} --xla_dump_to={dump} "
        "--xla_dump_hlo_as_text --xla_dump_hlo_pass_re=spmd-partitioning"
    )
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    topology = request.get("tpu_topology")
    if topology:
        # libtpu locks a file per process unless told that several processes may load it.
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    import jaxlib

    executable, seconds = compile_spmd(request["hlo"], n, bool(request.get("allow_output")), topology)
    stats = executable.get_compiled_memory_stats()
    whiles = []
    # XLA:CPU's pass is spmd-partitioning, XLA:TPU's tpu-spmd-partitioning.
    partitioned = sorted(glob.glob(os.path.join(dump, "*after_*spmd-partitioning*.txt")))
    if partitioned:
        with open(partitioned[-1]) as f:
            whiles = partitioned_whiles(f.read())
    return {
        "xla": f"jaxlib {jaxlib.__version__} " + (
            f"(XLA:TPU, libtpu {_libtpu_version()}, GSPMD ahead of time for {topology})"
            if topology else f"(XLA GSPMD on {n} virtual CPU devices)"
        ),
        "total_bytes": memory_total(executable),
        "argument_bytes": int(stats.argument_size_in_bytes),
        "output_bytes": int(stats.output_size_in_bytes),
        "temp_bytes": int(stats.temp_size_in_bytes),
        "alias_bytes": int(stats.alias_size_in_bytes),
        "while_shapes": whiles,
        "seconds": round(seconds, 3),
    }  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

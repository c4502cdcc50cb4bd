"""Memory estimate: accuracy on every corpus case, speed on the largest file.

    .venv/bin/python bench/memory.py

1. For each case with XLA's numbers (torch_xla truth.json: torch_xla's own
   CPU buffer assignment; JAX xla.json: compiled memory stats), our predicted
   bytes per device next to XLA's, with the relative error.
2. For the largest corpus file: the time of our estimate (parse + propagate +
   memory) against jaxlib's SPMD compile of the same text on 8 CPU devices.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from planner.hlo.compat import for_jaxlib_0_7  # noqa: E402
from planner.hlo.parser import parse_hlo  # noqa: E402
from planner.memory import memory_report  # noqa: E402
from planner.propagation import PropagationOptions  # noqa: E402
from planner.sharding import clear_caches  # noqa: E402

SHARED = Path(os.environ.get("SPMD_SHARED_DIR", REPO.parent / "shared"))


def largest_corpus_file() -> Path:
    return max((SHARED / "corpus").glob("*/*.hlo"), key=lambda p: p.stat().st_size)


def xla_stats(text: str, partitions: int = 8) -> tuple[int, float]:
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
    build.allow_spmd_sharding_propagation_to_output = [True]
    client = xla_bridge.get_backend()
    devices = xla_client.DeviceList(tuple(jax.devices()[:partitions]))
    compile_fn = client.compile_and_load if hasattr(client, "compile_and_load") else client.compile
    executable = compile_fn(mlir, devices, options)
    seconds = time.perf_counter() - start
    stats = executable.get_compiled_memory_stats()
    total = (
        stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes - stats.alias_size_in_bytes
    )
    return total, seconds


def accuracy_table() -> None:
    import json

    print(f"{'case':<44} {'ours MB':>9} {'XLA MB':>9} {'error':>7} {'ours s':>7}")
    cases = sorted((SHARED / "corpus").glob("torch_xla/*.truth.json")) + sorted(
        (SHARED / "corpus").glob("jax/*.xla.json")
    )
    for truth in cases:
        data = json.loads(truth.read_text())
        xla = data["memory"]["total_bytes"] if "memory" in data else data["xla_per_device_total_bytes"]
        text = truth.with_name(truth.name.split(".")[0] + ".hlo").read_text()
        clear_caches()
        start = time.perf_counter()
        ours = memory_report(parse_hlo(text)).total_bytes
        seconds = time.perf_counter() - start
        name = truth.name.split(".")[0]
        print(f"{name:<44} {ours / 1e6:>9.1f} {xla / 1e6:>9.1f} {(ours - xla) / xla:>+7.1%} {seconds:>7.3f}")


def main() -> int:
    accuracy_table()
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else largest_corpus_file()
    text = for_jaxlib_0_7(path.read_text())
    clear_caches()
    start = time.perf_counter()
    # Both sides may shard the outputs, as torch_xla and JAX compile a step.
    report = memory_report(parse_hlo(text), options=PropagationOptions(allow_to_output=(True,)))
    ours_seconds = time.perf_counter() - start
    xla_total, xla_seconds = xla_stats(text)
    print(f"\nlargest file: {path.name} ({path.stat().st_size / 1e6:.1f} MB of text)")
    print(f"  ours: {ours_seconds:.3f} s (parse + propagate + memory), {report.total_bytes:,} bytes per device")
    print(f"  XLA:  {xla_seconds:.3f} s (jaxlib compile, StableHLO path), {xla_total:,} bytes per device")
    print(f"  time ratio ours/XLA {ours_seconds / xla_seconds:.3f}")
    print("  (jaxlib's StableHLO pipeline is not torch_xla's: byte totals differ for torch_xla dumps;")
    print("   the table above compares each case with the XLA that produced it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run one torch_xla training step with SPMD on virtual CPU devices and record the module XLA compiled.

    python -m fidelity.run_torch_xla NAME --out DIR [--dumps DIR]

NAME.hlo is the step's module as XLA dumps it before optimizations, which is what a user sends. torch_xla
has no compiled-memory-stats API (and its runtime `get_memory_info` is unimplemented on CPU), so the
per-device bytes come from the buffer assignment XLA:CPU dumps for that module.
"""

from __future__ import annotations

import os
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from fidelity.cases import Case
from fidelity.dumps import allocation_bytes_by_kind, largest_module, while_shapes, xla_flags
from fidelity.models import example_llama_layers, torch_llama
from fidelity.record import count_opcode, mesh_record, process_maxrss_bytes, runner_main, write_fixture


def _partition_fn(case: Case) -> Any:
    from functorch.compile import default_partition, min_cut_rematerialization_partition

    return {None: default_partition, "min_cut": min_cut_rematerialization_partition}[case.remat]


def _notes(case: Case) -> str:
    remat = {
        None: "default_partition (no remat)",
        "min_cut": "partition_fn=functorch.compile.min_cut_rematerialization_partition",
    }[case.remat]
    run = {
        "scan": f"torch_xla scan_layers(model.layers, x, {remat})",
        "scan_no_shard_as": f"torch_xla scan_layers(model.layers, x, {remat}) with scan's own shard_as of the "
        "gradients disabled (torch_xla.experimental.scan.shard_as replaced by the identity)",
        "loop": "a plain Python loop over model.layers (no scan)",
    }[case.torch_mode]
    return (
        f"{run} over examples/llama_layers.py's LlamaStack "
        "(RMSNorm, SwiGLU, causal mask, no RoPE; weights sharded by its shard_model, each layer's output "
        "pinned with mark_sharding_with_gradients to its ACTIVATION_SPEC, x marked the same); "
        "loss = y.pow(2).mean(); loss.backward(); torch_xla.sync() computes loss and every gradient (no "
        "optimizer update). SPMD (torch_xla.runtime.use_spmd()) on PJRT_DEVICE=CPU CPU_NUM_DEVICES="
        f"{case.mesh.num_devices}, xs.Mesh(np.arange(n), shape, axis_names). NAME.hlo = the largest "
        "*before_optimizations.txt module in the --xla_dump_to dump, verbatim. xla_per_device_total_bytes = "
        "sum of all allocations in its cpu_after_optimizations-buffer-assignment.txt (by kind in "
        "xla_allocation_bytes_by_kind). compile_seconds = torch_xla's CompileTime metric for that compile; "
        "step_seconds = wall time of the sync (trace, compile and run). Dumps were enabled throughout."
    )


def run(case: Case, out_dir: Path, dump_dir: Path) -> None:
    started = time.perf_counter()
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr
    from torch_xla.experimental.scan_layers import scan_layers

    xr.use_spmd()
    mesh = xs.Mesh(np.arange(case.mesh.num_devices), case.mesh.shape, case.mesh.axis_names)
    model, x = torch_llama(case, mesh)
    # Run anything still pending from building the model now, so the step compiles as a module of its own.
    torch_xla.sync()

    for p in model.parameters():
        p.grad = None
    if case.torch_mode == "loop":
        y = x
        for layer in model.layers:
            y = layer(y)
    else:
        if case.torch_mode == "scan_no_shard_as":
            import torch_xla.experimental.scan as scan_module

            scan_module.shard_as = lambda a, b: (a, b)
        y = scan_layers(model.layers, x, partition_fn=_partition_fn(case))
    loss = y.pow(2).mean()
    loss.backward()
    t0 = time.perf_counter()
    torch_xla.sync()
    loss_value = float(loss.item())
    step_seconds = time.perf_counter() - t0
    _, _, compile_samples = met.metric_data("CompileTime") or (0, 0, [])

    module = largest_module(dump_dir)
    hlo_text = module.before_optimizations.read_text()
    by_kind = allocation_bytes_by_kind(module.buffer_assignment.read_text())
    spec = torch_xla._XLAC._get_xla_sharding_spec
    named = list(model.layers.named_parameters())

    example = example_llama_layers()
    specs = example.PARTITION_SPECS
    record: dict[str, Any] = {
        "name": case.name,
        "config": case.config() | {"activation_spec": list(example.ACTIVATION_SPEC)},
        "hlo": f"{case.name}.hlo",
        "mesh": mesh_record(case),
        "parameter_names": [n for n, _ in named],
        "param_partition_specs": {n: list(specs[n.split(".", 1)[1]]) for n, _ in named if n.split(".", 1)[1] in specs},
        "xla_param_shardings": {n: spec(p) for n, p in named},
        "gradient_shardings": {n: spec(p.grad) for n, p in named},
        "xla_per_device_total_bytes": sum(by_kind.values()),
        "xla_allocation_bytes_by_kind": by_kind,
        "xla_post_partition_while_shapes": while_shapes(module.after_spmd_partitioning.read_text()),
        "xla_after_optimizations_while_shapes": while_shapes(module.after_optimizations.read_text()),
        "torch_xla_version": torch_xla.__version__,
        "torch": torch.__version__,
        # torch_xla's shard_as goes through JAX, so its version is part of what made the module.
        "jax": version("jax"),
        "jaxlib": version("jaxlib"),
        "loss": loss_value,
        # CompileTime samples are nanoseconds; the step's compile is the longest of this process.
        "compile_seconds": round(max((v for _, v in compile_samples), default=0) / 1e9, 3),
        "step_seconds": round(step_seconds, 3),
        "opt_barrier_count": count_opcode(hlo_text, "opt-barrier"),
        "dump_files": module.file_names(),
        "process_maxrss_bytes": process_maxrss_bytes(),
        "wall_seconds": round(time.perf_counter() - started, 2),
        "notes": _notes(case),
    }
    write_fixture(out_dir, case.name, hlo_text, record)


def set_environment(case: Case, dump_dir: Path) -> None:
    os.environ["PJRT_DEVICE"] = "CPU"
    os.environ["CPU_NUM_DEVICES"] = str(case.mesh.num_devices)
    os.environ["XLA_FLAGS"] = xla_flags(dump_dir)


def main(argv: list[str] | None = None) -> int:
    return runner_main(argv, __doc__.splitlines()[0], "torch_xla", set_environment, run)


if __name__ == "__main__":
    sys.exit(main())

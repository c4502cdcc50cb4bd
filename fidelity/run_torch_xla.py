"""Run one torch_xla training step with SPMD on virtual CPU devices and record the module XLA compiled.

    python -m fidelity.run_torch_xla NAME --out DIR [--dumps DIR] [--disable-passes A,B,C] [--dump-all]

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
from fidelity.record import RunOptions, count_opcode, mesh_record, process_maxrss_bytes, runner_main, write_fixture
from fidelity.torch_models import LM_PARTITION_SPECS, TOKENS_SPEC, example_llama_layers, lm_loss, torch_llama, torch_lm


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
    stack = (
        f"{run} over examples/llama_layers.py's LlamaStack "
        "(RMSNorm, SwiGLU, causal mask, no RoPE; weights sharded by its shard_model, each layer's output "
        "pinned with mark_sharding_with_gradients to its ACTIVATION_SPEC"
    )
    if case.step == "toy":
        step = (
            f"{stack}, x marked the same); loss = y.pow(2).mean(); loss.backward(); torch_xla.sync() computes "
            "loss and every gradient (no optimizer update)"
        )
    else:
        head = "head.weight = embed.weight (tied)" if case.step == "lm_tied" else "head nn.Linear(D, V, bias=False)"
        update = (
            "; torch.optim.AdamW(lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1) stepped inside the traced graph "
            "(its state initialised by one step on zero gradients, run before, so m, v and the params are the "
            "step's inputs)"
            if case.optimizer
            else " (no optimizer update)"
        )
        step = (
            f"language model: int64 tokens [B,S+1] marked {TOKENS_SPEC}; nn.Embedding(V, D) of tokens[:, :-1], "
            f"{stack}), RMSNorm, {head}; weights {LM_PARTITION_SPECS}; logits.float(), "
            "F.cross_entropy against tokens[:, 1:] (log_softmax + nll_loss: a gather); loss.backward()"
            f"{update}; torch_xla.sync() runs it all"
        )
    return (
        f"{step}. SPMD (torch_xla.runtime.use_spmd()) on PJRT_DEVICE=CPU CPU_NUM_DEVICES="
        f"{case.mesh.num_devices}, xs.Mesh(np.arange(n), shape, axis_names). NAME.hlo = the largest "
        "*before_optimizations.txt module in the --xla_dump_to dump, verbatim. xla_per_device_total_bytes = "
        "sum of all allocations in its cpu_after_optimizations-buffer-assignment.txt (by kind in "
        "xla_allocation_bytes_by_kind). compile_seconds = torch_xla's CompileTime metric for that compile; "
        "step_seconds = wall time of the sync (trace, compile and run). Dumps were enabled throughout."
    )


def run(case: Case, out_dir: Path, dump_dir: Path, options: RunOptions) -> None:
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
    model, x = torch_llama(case, mesh) if case.step == "toy" else torch_lm(case, mesh)
    layers = model.layers if case.step == "toy" else model.stack.layers
    optimizer = None
    if case.optimizer:
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
        # AdamW creates its state on its first step: take that step now, on zero gradients, so the
        # recorded step reads m and v as its inputs like every later one.
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
    # Run anything still pending from building the model now, so the step compiles as a module of its own.
    torch_xla.sync()

    for p in model.parameters():
        p.grad = None
    if case.torch_mode == "scan_no_shard_as":
        import torch_xla.experimental.scan as scan_module

        scan_module.shard_as = lambda a, b: (a, b)

    def run_layers(h: Any) -> Any:
        if case.torch_mode == "loop":
            for layer in layers:
                h = layer(h)
            return h
        return scan_layers(layers, h, partition_fn=_partition_fn(case))

    loss = run_layers(x).pow(2).mean() if case.step == "toy" else lm_loss(model, x, run_layers)
    loss.backward()
    if optimizer is not None:
        optimizer.step()
    t0 = time.perf_counter()
    torch_xla.sync()
    loss_value = float(loss.item())
    step_seconds = time.perf_counter() - t0
    _, _, compile_samples = met.metric_data("CompileTime") or (0, 0, [])

    module = largest_module(dump_dir)
    hlo_text = module.before_optimizations.read_text()
    by_kind = allocation_bytes_by_kind(module.buffer_assignment.read_text())
    spec = torch_xla._XLAC._get_xla_sharding_spec
    named = list(layers.named_parameters())
    around = [(n, p) for n, p in model.named_parameters() if not n.startswith("stack.")] if case.step != "toy" else []

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
        # The language model's own weights (embedding, final norm, head), by their names in the model.
        "lm_param_shardings": {n: spec(p) for n, p in around} if around else None,
        "lm_gradient_shardings": {n: spec(p.grad) for n, p in around} if around else None,
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
        "experiment": options.experiment(),
        "process_maxrss_bytes": process_maxrss_bytes(),
        "wall_seconds": round(time.perf_counter() - started, 2),
        "notes": _notes(case),
    }
    write_fixture(out_dir, case.name, hlo_text, record)


def set_environment(case: Case, dump_dir: Path, options: RunOptions) -> None:
    os.environ["PJRT_DEVICE"] = "CPU"
    os.environ["CPU_NUM_DEVICES"] = str(case.mesh.num_devices)
    os.environ["XLA_FLAGS"] = xla_flags(dump_dir, dump_all=options.dump_all, disabled_passes=options.disabled_passes)


def main(argv: list[str] | None = None) -> int:
    return runner_main(argv, __doc__.splitlines()[0], "torch_xla", set_environment, run)


if __name__ == "__main__":
    sys.exit(main())

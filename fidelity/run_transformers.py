"""Run one training step of a transformers model under torch_xla (SPMD, virtual CPU devices) and record the
module XLA compiled, as `run_torch_xla` does for the example stack.

    python -m fidelity.run_transformers NAME --out DIR [--dumps DIR] [--disable-passes A,B,C] [--dump-all]

The step is the one a torch_xla user trains: the model's own forward and loss, its decoder layers through
the drop-in `scan_decoder_layers` (one scan over stacked weights, as torch_xla's `scan_layers`) or its own
loop, `loss.backward()`, AdamW's update, one `torch_xla.sync()`; AdamW's state exists already (one update on
zero gradients first), so the recorded step reads and donates it like every later one.
"""

from __future__ import annotations

import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from fidelity.cases import Case
from fidelity.dumps import allocation_bytes_by_kind, largest_module, while_shapes
from fidelity.record import RunOptions, count_opcode, mesh_record, process_maxrss_bytes, runner_main, write_fixture
from fidelity.run_torch_xla import _partition_fn, set_environment
from fidelity.transformers_models import TOKENS_SPEC, transformers_lm, transformers_loss


def _notes(case: Case, model_class: str, specs: dict[str, Any]) -> str:
    layers = (
        "its decoder layers through scan_runtime's scan_decoder_layers (scan_layers over the stacked weights, "
        f"partition_fn={'min_cut_rematerialization_partition' if case.remat else 'default_partition'})"
        if case.torch_mode == "scan"
        else "its decoder layers in its own loop"
    )
    return (
        f"transformers {version('transformers')} {model_class} from a config (no weights), eager attention, "
        f"{layers}; parameters marked FSDPv2-style {specs}; int64 tokens [B,S] marked {TOKENS_SPEC}; "
        "loss = model(input_ids=tokens, labels=tokens).loss; loss.backward(); torch.optim.AdamW(lr=3e-4, "
        "betas=(0.9, 0.95), weight_decay=0.1).step() (its state made by one update on zero gradients, run "
        f"before); torch_xla.sync() runs it all. SPMD on PJRT_DEVICE=CPU CPU_NUM_DEVICES={case.mesh.num_devices}. "
        "NAME.hlo = the largest *before_optimizations.txt module of the dump, verbatim; "
        "xla_per_device_total_bytes = the sum of its cpu_after_optimizations buffer assignment's allocations."
    )


def run(case: Case, out_dir: Path, dump_dir: Path, options: RunOptions) -> None:
    started = time.perf_counter()
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    from scan_runtime import scan_decoder_layers

    xr.use_spmd()
    mesh = xs.Mesh(np.arange(case.mesh.num_devices), case.mesh.shape, case.mesh.axis_names)
    model, tokens, specs = transformers_lm(case, mesh)
    if case.torch_mode == "scan":
        scan_decoder_layers(model, partition_fn=_partition_fn(case))
    layers = model.model.layers
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    torch_xla.sync()
    for p in model.parameters():
        p.grad = None

    loss = transformers_loss(model, tokens)
    loss.backward()
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
    prefix = "model.layers."
    around = [(n, p) for n, p in model.named_parameters() if not n.startswith(prefix)]
    record: dict[str, Any] = {
        "name": case.name,
        "config": case.config(),
        "hlo": f"{case.name}.hlo",
        "mesh": mesh_record(case),
        "parameter_names": [n for n, _ in named],
        "param_partition_specs": {n: list(specs[prefix + n]) for n, _ in named if prefix + n in specs},
        "xla_param_shardings": {n: spec(p) for n, p in named},
        "gradient_shardings": {n: spec(p.grad) for n, p in named},
        "lm_param_shardings": {n: spec(p) for n, p in around},
        "lm_gradient_shardings": {n: spec(p.grad) for n, p in around},
        "xla_per_device_total_bytes": sum(by_kind.values()),
        "xla_allocation_bytes_by_kind": by_kind,
        "xla_post_partition_while_shapes": while_shapes(module.after_spmd_partitioning.read_text()),
        "xla_after_optimizations_while_shapes": while_shapes(module.after_optimizations.read_text()),
        "torch_xla_version": torch_xla.__version__,
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "jax": version("jax"),
        "jaxlib": version("jaxlib"),
        "loss": loss_value,
        "compile_seconds": round(max((v for _, v in compile_samples), default=0) / 1e9, 3),
        "step_seconds": round(step_seconds, 3),
        "opt_barrier_count": count_opcode(hlo_text, "opt-barrier"),
        "dump_files": module.file_names(),
        "experiment": options.experiment(),
        "process_maxrss_bytes": process_maxrss_bytes(),
        "wall_seconds": round(time.perf_counter() - started, 2),
        "notes": _notes(case, type(model).__name__, specs),
    }
    write_fixture(out_dir, case.name, hlo_text, record)


def main(argv: list[str] | None = None) -> int:
    return runner_main(argv, __doc__.splitlines()[0], "torch_xla", set_environment, run)


if __name__ == "__main__":
    sys.exit(main())

"""Lower and compile one JAX case on virtual CPU devices, and for its TPU chip, and record what XLA decided.

    python -m fidelity.run_jax NAME --out DIR [--dumps DIR]

One case per process: XLA reads its flags (device count, dump directory) once, when jax is imported.
The TPU compile is libtpu's, ahead of time, for a topology libtpu describes without a TPU attached
(`jax.experimental.topologies`): the same step lowered on a mesh of that topology's devices.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from fidelity.cases import Case
from fidelity.dumps import (
    allocation_bytes_by_kind,
    header_attribute_names,
    instruction_names,
    largest_module,
    while_shapes,
    xla_flags,
)
from fidelity.models import jax_abstract_inputs, jax_out_shardings, jax_specs, jax_train_step
from fidelity.record import count_opcode, mesh_record, process_maxrss_bytes, runner_main, write_fixture

MEMORY_FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "temp_size_in_bytes",
    "alias_size_in_bytes",
    "generated_code_size_in_bytes",
)


def _spec_text(spec: Any) -> str:
    return "P(" + ", ".join(repr(a) for a in spec) + ")" if spec is not None else "None"


FAMILY_NOTES = {
    "llama": "llama stack (RMSNorm, GQA attention with RoPE, causal mask, softmax in f32, SwiGLU)",
    "gpt2": "GPT-2 stack (LayerNorm with bias, fused qkv projection with bias, causal mask, GELU MLP with biases)",
    "mlp": "plain MLP stack (x + relu(x @ w_in + b_in) @ w_out + b_out)",
    "moe": "mixture-of-experts stack (llama attention, top-k softmax router, dense dispatch to every expert)",
}


def _notes(case: Case) -> str:
    remat = {
        None: "no remat",
        "full": "jax.checkpoint (default policy: saves nothing, prevent_cse=True) around the scanned step",
        "dots": "jax.checkpoint(policy=dots_with_no_batch_dims_saveable) around the scanned step",
    }[case.remat]
    partitioner = {
        "gspmd": "GSPMD (jax_use_shardy_partitioner=False)",
        "shardy": "Shardy (jax_use_shardy_partitioner=True)",
    }[case.partitioner]
    _, x_spec = jax_specs(case)
    grads = "pinned: out_shardings = each parameter's sharding" if case.pinned else "free: out_shardings unspecified"
    tpu = (
        f"tpu_memory = the same step lowered on a mesh of libtpu's {case.tpu_topology} topology devices and "
        "compiled ahead of time by XLA:TPU (no TPU attached), compiled.memory_analysis() per device"
        if case.tpu_topology
        else "no TPU compile"
    )
    return (
        f"{FAMILY_NOTES[case.family]} under jax.lax.scan over stacked params [L,...]; {remat}; "
        "jit(value_and_grad(loss)) -> (loss, grads dict); loss=mean(y.astype(f32)**2); "
        f"{partitioner}; {case.mesh.num_devices} virtual CPU devices (--xla_force_host_platform_device_count), "
        "mesh in device-id order; abstract inputs only (jax.ShapeDtypeStruct with NamedSharding); x sharded "
        f"{_spec_text(x_spec)}, weights as in `params`; grads {grads}. NAME.hlo = "
        "lowered.as_text(dialect='hlo', debug_info=True) verbatim (debug_info keeps op metadata) with its "
        "HloModule header line replaced by XLA's own from the before_optimizations dump (adds num_partitions and "
        "the allow_spmd_sharding_propagation flags of the compile). memory = compiled.memory_analysis() per "
        "device, total_bytes = argument + output + temp - alias; xla_allocation_bytes_by_kind / "
        "xla_per_device_total_bytes = allocations in the step's CPU buffer assignment (as the torch_xla corpus "
        "records them). post_partition_while_shapes from the *after_spmd-partitioning* dump, "
        f"after_optimizations_while_shapes from *cpu_after_optimizations.txt. {tpu}. compile_seconds measured "
        "with the HLO dumps enabled."
    )


def _memory(stats: Any) -> dict[str, int]:
    memory = {k: int(getattr(stats, k)) for k in MEMORY_FIELDS}
    memory["total_bytes"] = (
        memory["argument_size_in_bytes"]
        + memory["output_size_in_bytes"]
        + memory["temp_size_in_bytes"]
        - memory["alias_size_in_bytes"]
    )
    return memory


def _tpu_memory(case: Case) -> dict[str, Any] | None:
    """XLA:TPU's memory stats for the step, compiled ahead of time for the case's topology."""
    if case.tpu_topology is None:
        return None
    import jax
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh

    topology = topologies.get_topology_desc(platform="tpu", topology_name=case.tpu_topology)
    devices = topology.devices[: case.mesh.num_devices]
    mesh = Mesh(np.array(devices).reshape(case.mesh.shape), case.mesh.axis_names)
    params, x = jax_abstract_inputs(case, mesh)
    t0 = time.perf_counter()
    step = jax.jit(jax_train_step(case), out_shardings=jax_out_shardings(case, mesh, params))
    compiled = step.lower(params, x).compile()
    return {
        "topology": case.tpu_topology,
        "device_kind": str(getattr(devices[0], "device_kind", "")),
        "num_devices": len(devices),
        "compile_seconds": round(time.perf_counter() - t0, 3),
        "memory": _memory(compiled.memory_analysis()),
    }


def _output_shardings(shardings: Any, shapes: Any) -> dict[str, Any]:
    """Names, HloSharding text and (for the gradients) spec and per-device shape of each `(loss, grads)` leaf."""
    import jax

    leaves = jax.tree_util.tree_leaves_with_path(shardings)
    shape_leaves = jax.tree_util.tree_leaves(shapes)
    # Leaf 0 is the loss; the others are paths (1, 'wq') into the grads dict.
    names = ["loss"] + ["grads" + jax.tree_util.keystr(path[1:]) for path, _ in leaves[1:]]
    return {
        "names": names,
        "hlo": [str(s._to_xla_hlo_sharding(len(a.shape))) for (_, s), a in zip(leaves, shape_leaves)],
        "grads": {
            jax.tree_util.keystr(path[1:], simple=True): {
                "spec": _spec_text(getattr(s, "spec", None)),
                "shard_shape": list(s.shard_shape(a.shape)),
            }
            for (path, s), a in zip(leaves[1:], shape_leaves[1:])
        },
    }


def run(case: Case, out_dir: Path, dump_dir: Path) -> None:
    started = time.perf_counter()
    import jax
    import jaxlib
    import numpy as np
    from jax.sharding import Mesh

    jax.config.update("jax_use_shardy_partitioner", case.partitioner == "shardy")
    devices = jax.devices()
    if len(devices) < case.mesh.num_devices:
        raise RuntimeError(f"{case.name} needs {case.mesh.num_devices} devices, jax sees {len(devices)}")
    mesh = Mesh(np.array(devices[: case.mesh.num_devices]).reshape(case.mesh.shape), case.mesh.axis_names)
    params, x = jax_abstract_inputs(case, mesh)

    t0 = time.perf_counter()
    lowered = jax.jit(jax_train_step(case), out_shardings=jax_out_shardings(case, mesh, params)).lower(params, x)
    hlo_text = lowered.as_text(dialect="hlo", debug_info=True)
    lower_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = lowered.compile()
    compile_seconds = time.perf_counter() - t0

    opt_barriers = count_opcode(hlo_text, "opt-barrier")
    if case.remat is not None and not opt_barriers:
        raise RuntimeError(f"{case.name}: jax.checkpoint left no opt-barrier in the lowered HLO")

    memory = _memory(compiled.memory_analysis())

    module = largest_module(dump_dir)
    before = module.before_optimizations.read_text()
    lowered_header, body = hlo_text.split("\n", 1)
    # XLA's own header carries the compile options the step was compiled with (num_partitions, which
    # outputs propagation may shard): without them the text does not say how XLA compiled it.
    hlo_text = before.split("\n", 1)[0] + "\n" + body
    by_kind = allocation_bytes_by_kind(module.buffer_assignment.read_text())

    outputs = _output_shardings(compiled.output_shardings, jax.eval_shape(jax_train_step(case), params, x))
    param_specs, x_spec = jax_specs(case)

    record: dict[str, Any] = {
        "name": case.name,
        "generator": f"fidelity.run_jax (jax {jax.__version__})",
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "mesh": mesh_record(case),
        "compile_seconds": round(compile_seconds, 3),
        "lower_seconds": round(lower_seconds, 3),
        "memory": memory,
        "tpu": _tpu_memory(case),
        "xla_per_device_total_bytes": sum(by_kind.values()),
        "xla_allocation_bytes_by_kind": by_kind,
        "output_shardings": outputs["hlo"],
        "post_partition_while_shapes": while_shapes(module.after_spmd_partitioning.read_text()),
        "after_optimizations_while_shapes": while_shapes(module.after_optimizations.read_text()),
        "params": {
            f"params['{k}']": {
                "shape": list(v.shape),
                "dtype": str(v.dtype),
                "partition_spec": list(param_specs[k]),
            }
            for k, v in sorted(params.items())
        }
        | {"x": {"shape": list(x.shape), "dtype": str(x.dtype), "partition_spec": list(x_spec)}},
        "outputs": outputs["names"],
        "config": case.config(),
        "analysis": {
            "param_shard_shapes": {k: list(v.sharding.shard_shape(v.shape)) for k, v in sorted(params.items())},
            "grad_output_shardings": outputs["grads"],
        },
        "hlo_header": {
            "replaced": True,
            "lowered_header_attrs": header_attribute_names(lowered_header),
            "xla_header_attrs": header_attribute_names(before),
            "xla_header": before.split("\n", 1)[0],
            "names_equal_to_before_optimizations_dump": instruction_names(hlo_text) == instruction_names(before),
        },
        "opt_barrier_count": opt_barriers,
        "dump_files": module.file_names(),
        "process_maxrss_bytes": process_maxrss_bytes(),
        "wall_seconds": round(time.perf_counter() - started, 2),
        "notes": _notes(case),
    }
    write_fixture(out_dir, case.name, hlo_text, record)


def set_environment(case: Case, dump_dir: Path) -> None:
    os.environ["XLA_FLAGS"] = xla_flags(dump_dir, num_host_devices=case.mesh.num_devices)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # libtpu takes a lock file per process unless told that several may load it: the sweep runs cases side by side.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def main(argv: list[str] | None = None) -> int:
    return runner_main(argv, __doc__.splitlines()[0], "jax", set_environment, run)


if __name__ == "__main__":
    sys.exit(main())

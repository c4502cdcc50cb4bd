"""Lower and compile one JAX case on virtual CPU devices, and for its TPU chip, and record what XLA decided.

    python -m fidelity.run_jax NAME --out DIR [--dumps DIR] [--tpu-pre-propagation]
                               [--disable-passes A,B,C] [--dump-all]

One case per process: XLA reads its flags (device count, dump directory, disabled passes) once, when
jax is imported, and both compilers of the process share them. The TPU compile is libtpu's, ahead of
time, for a topology libtpu describes without a TPU attached (`jax.experimental.topologies`): the
same step lowered on a mesh of that topology's devices. Each compiler's decisions are recorded pass
by pass: instruction shardings after its last propagation pass, per-device While shapes after its
partitioner, output shardings and memory of the compiled executable.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from fidelity.cases import Case
from fidelity.dumps import (
    ModuleDump,
    allocation_bytes_by_kind,
    header_attribute_names,
    instruction_names,
    largest_module,
    while_shapes,
    xla_flags,
)
from fidelity.hlo_text import instruction_shardings, read_module, source_names
from fidelity.memory_stats import hbm_oom, memory_record
from fidelity.record import (
    RunOptions,
    count_opcode,
    mesh_record,
    process_maxrss_bytes,
    runner_main,
    write_fixture,
)
from fidelity.steps import VIT_PATCH, abstract_args, arg_names, jit_options, output_names, train_step

TPU_PRE_PROPAGATION_SUFFIX = ".tpu_pre_propagation.hlo"
# XLA:CPU's own dump of the module it was given (`before_optimizations`): the form a user saves with
# --xla_dump_to. Newer XLA prints it unlike JAX's lowered text (Shardy shardings native, `%t#k` operands).
XLA_DUMP_SUFFIX = ".xla_dump.hlo"


def _spec_text(spec: Any) -> str:
    return "P(" + ", ".join(repr(a) for a in spec) + ")" if spec is not None else "None"


FAMILY_NOTES = {
    "llama": "llama stack (RMSNorm, GQA attention with RoPE, causal mask, softmax in f32, SwiGLU)",
    "gpt2": "GPT-2 stack (LayerNorm with bias, fused qkv projection with bias, causal mask, GELU MLP with biases)",
    "mlp": "plain MLP stack (x + relu(x @ w_in + b_in) @ w_out + b_out)",
    "moe": "mixture-of-experts stack (llama attention, top-k softmax router, dense dispatch to every expert)",
}


def _step_notes(case: Case, args: tuple[Any, ...]) -> str:
    """What the step computes, in words, with the batch's and head's shardings."""
    if case.step == "toy":
        grads = "value_and_grad(loss)"
        if case.microbatches > 1:
            grads = (
                f"an outer lax.scan over {case.microbatches} microbatches (x reshaped [k, B/k, S, D] and "
                "constrained P(None, batch, None, None)) of value_and_grad(loss), gradients accumulated in f32 "
                "from zeros, loss and gradients divided by k"
            )
        return (
            f"jit({grads}) -> (loss, grads dict); loss=mean(y.astype(f32)**2); x sharded "
            f"{_spec_text(args[1].sharding.spec)}, weights as in `params`"
        )
    batch = {k: _spec_text(v.sharding.spec) for k, v in args[-1].items()}
    ce = {
        "take_along_axis": "-take_along_axis(log_softmax(logits), targets) (a gather; its gradient a scatter)",
        "one_hot": "-sum(one_hot(targets) * log_softmax(logits), -1) (MaxText's spelling)",
    }[case.cross_entropy or ""]
    if case.step == "vit":
        body = (
            f"ViT: images [B,H,W,3] cut into {VIT_PATCH}x{VIT_PATCH} patches by conv_general_dilated (stride = "
            "kernel, NHWC/HWIO) plus a bias, + learned positions, the stack without a causal mask, final "
            "LayerNorm, mean over patches, classifier [D,classes] ('fsdp', None), logits in f32, cross-entropy "
            f"{ce} against int32 labels [B]"
        )
    else:
        head = "head = embed.T (tied)" if case.step == "lm_tied" else "head [D,V] ('fsdp','tp')"
        norm = "LayerNorm" if case.family == "gpt2" else "RMSNorm"
        body = (
            "language model: int32 tokens [B,S+1], inputs tokens[:, :-1], targets tokens[:, 1:]; embedding "
            f"[V,D] ('tp','fsdp') gathered per token{' + learned positions' if case.family == 'gpt2' else ''}, "
            f"the stack, final {norm}, {head}, logits cast to f32, per-token loss {ce}"
        )
        if case.z_loss:
            body += " + 1e-4 * logsumexp(logits)**2 (z-loss)"
        if case.packed:
            body += (
                "; packed: segment_ids and positions [B,S+1] in the batch, attention masked to the same segment "
                "(causal), RoPE by positions, loss averaged over targets whose segment is nonzero and equal to "
                "the input's (label masking)"
            )
        else:
            body += ", averaged"
        if case.seq_parallel:
            body += (
                "; sequence parallel: with_sharding_constraint(x, P(batch, 'tp', None)) on the embedded "
                "activations and after every residual add"
            )
    grads = "value_and_grad(loss)"
    if case.microbatches > 1:
        grads = (
            f"an outer lax.scan over {case.microbatches} microbatches (batch reshaped [k, B/k, ...] and "
            "constrained P(None, batch, ...)) of value_and_grad(loss), gradients accumulated in f32 from zeros, "
            "loss and gradients divided by k"
        )
    if case.optimizer:
        state = {
            None: f"m and v in the params' dtype ({case.size.dtype})",
            "f32_state": "bf16 params, m and v in f32 (update computed in f32, rounded into the params)",
            "f32_master": "bf16 params, m, v and an f32 master copy in the state (update applied to the master, "
            "params = master rounded to bf16)",
        }[case.mixed_precision]
        clip = "global-norm clipping to 1.0 (norm in f32), then " if case.optimizer == "adamw_clip" else ""
        tail = (
            f"; {grads}, then {clip}hand-written AdamW (lr 3e-4, b1 0.9, b2 0.95, eps 1e-8, bias-corrected by an "
            "int32 step count, decoupled weight decay 0.1 on matrices only); "
            f"{state}; jit(donate_argnums=(0, 1), out_shardings = in_shardings of params and state, loss "
            "replicated) -> (new params, new opt_state, loss)"
        )
    else:
        tail = f"; jit({grads}) -> (loss, grads dict)"
    return f"{body}{tail}; batch sharded {batch}, weights as in `params`"


def _notes(case: Case, args: tuple[Any, ...]) -> str:
    remat = {
        None: "no remat",
        "full": "jax.checkpoint (default policy: saves nothing, prevent_cse=True) around the scanned step",
        "dots": "jax.checkpoint(policy=dots_with_no_batch_dims_saveable) around the scanned step",
    }[case.remat]
    partitioner = {
        "gspmd": "GSPMD (jax_use_shardy_partitioner=False)",
        "shardy": "Shardy (jax_use_shardy_partitioner=True)",
    }[case.partitioner]
    if case.optimizer:
        outputs = "params and opt_state pinned to their in_shardings (donated)"
    else:
        outputs = "grads pinned: out_shardings = each parameter's sharding" if case.pinned else "grads free"
    tpu = (
        f"tpu = the same step lowered on a mesh of libtpu's {case.tpu_topology} topology devices and compiled "
        "ahead of time by XLA:TPU (no TPU attached): memory = compiled.memory_analysis() per device, "
        "hbm_bytes = its buffer assignment's allocations in memory space 0 (HBM per chip), "
        "instruction_shardings (XLA:TPU's names) after its last propagation pass, post_partition_while_shapes "
        "after tpu-spmd-partitioning, output_shardings of the compiled executable, pre_propagation_module the "
        "module entering its first propagation pass"
        if case.tpu_topology
        else "no TPU compile"
    )
    keys = (
        "NAME.hlo's names (XLA's CallInliner clones mapped back structurally; name@call for a callee with "
        "several call sites; see name_mapping)"
        if case.partitioner == "gspmd"
        else "XLA's own names (shardy-xla renames every instruction)"
    )
    return (
        f"{FAMILY_NOTES[case.family]} under jax.lax.scan over stacked params [L,...]; {remat}; "
        f"{_step_notes(case, args)}; {outputs}. "
        f"{partitioner}; {case.mesh.num_devices} virtual CPU devices (--xla_force_host_platform_device_count), "
        "mesh in device-id order; abstract inputs only (jax.ShapeDtypeStruct with NamedSharding). NAME.hlo = "
        "lowered.as_text(dialect='hlo', debug_info=True) verbatim (debug_info keeps op metadata) with its "
        "HloModule header line replaced by XLA's own from the before_optimizations dump (adds num_partitions and "
        "the allow_spmd_sharding_propagation flags of the compile). memory = compiled.memory_analysis() per "
        "device, total_bytes = argument + output + temp - alias; xla_allocation_bytes_by_kind / "
        "xla_per_device_total_bytes = allocations in the step's CPU buffer assignment (as the torch_xla corpus "
        "records them). instruction_shardings = XLA:CPU's module after its propagation pass "
        f"({'sharding-propagation' if case.partitioner == 'gspmd' else 'shardy-xla'}), keyed by "
        f"{keys}; post_partition_while_shapes from the *after_spmd-partitioning* dump, "
        f"after_optimizations_while_shapes from *cpu_after_optimizations.txt. {tpu}. compile_seconds measured "
        "with the HLO dumps enabled."
    )


def _output_shardings(case: Case, shardings: Any, shapes: Any) -> dict[str, Any]:
    """Names, HloSharding text and, for the gradients or new params, spec and per-device shape of each output."""
    import jax

    leaves = jax.tree_util.tree_leaves_with_path(shardings)
    shape_leaves = jax.tree_util.tree_leaves(shapes)
    # Paths start at the output tuple's index: (1, 'wq') is grads['wq'], (0,) the loss.
    tops = output_names(case)
    names = [tops[path[0].idx] + jax.tree_util.keystr(path[1:]) for path, _ in leaves]  # type: ignore[attr-defined]
    per_param = {
        jax.tree_util.keystr(path[1:], simple=True): {
            "spec": _spec_text(getattr(s, "spec", None)),
            "shard_shape": list(s.shard_shape(a.shape)),
        }
        for (path, s), a in zip(leaves, shape_leaves)
        if tops[path[0].idx] in ("grads", "params")  # type: ignore[attr-defined]
    }
    return {
        "names": names,
        "hlo": [str(s._to_xla_hlo_sharding(len(a.shape))) for (_, s), a in zip(leaves, shape_leaves)],
        "per_param": per_param,
    }


def _args_record(case: Case, args: tuple[Any, ...]) -> dict[str, Any]:
    """Every argument leaf: `params['wq']`, `opt_state['m']['wq']`, `batch['tokens']`, or the toy step's `x`."""
    import jax

    record = {}
    for name, arg in zip(arg_names(case), args):
        for path, leaf in jax.tree_util.tree_leaves_with_path(arg):
            record[name + jax.tree_util.keystr(path)] = {
                "shape": list(leaf.shape),
                "dtype": str(leaf.dtype),
                "partition_spec": list(leaf.sharding.spec),
            }
    return record


def _mesh(case: Case, devices: list[Any]) -> Any:
    import numpy as np
    from jax.sharding import Mesh

    return Mesh(np.array(devices[: case.mesh.num_devices]).reshape(case.mesh.shape), case.mesh.axis_names)


def _lower(case: Case, mesh: Any) -> tuple[Any, tuple[Any, ...]]:
    import jax

    args = abstract_args(case, mesh)
    return jax.jit(train_step(case, mesh), **jit_options(case, mesh, args)).lower(*args), args


def _tpu(
    case: Case, out_dir: Path, dump_dir: Path, taken: tuple[str, ...], options: RunOptions
) -> dict[str, Any] | None:
    """XLA:TPU's decisions for the step, compiled ahead of time for the case's topology."""
    if case.tpu_topology is None:
        return None
    import jax
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(platform="tpu", topology_name=case.tpu_topology)
    devices = list(topology.devices)
    mesh = _mesh(case, devices)
    t0 = time.perf_counter()
    lowered, args = _lower(case, mesh)
    try:
        compiled = lowered.compile()
    except Exception as e:  # only an out-of-memory refusal is a result; anything else re-raises
        # libtpu 0.0.52 refuses at compile time a step that needs more HBM than the chip has (0.0.20 compiled
        # the same 405B step): the refusal and the bytes it quotes are the reference, and the partitioner's
        # dumps, written before buffer assignment, still hold its decisions.
        oom = hbm_oom(str(e))
        if oom is None:
            raise
        compiled = None
    compile_seconds = time.perf_counter() - t0
    module = largest_module(dump_dir, exclude=taken)
    propagated = module.after_propagation
    pre_propagation = None
    if options.tpu_pre_propagation:
        pre_propagation = case.name + TPU_PRE_PROPAGATION_SUFFIX
        (out_dir / pre_propagation).write_text(module.before_propagation.read_text())
    from planner.plan.compilers.xla_compile import hbm_allocated_bytes

    if compiled is None:
        outcome: dict[str, Any] = {"oom": oom}
    else:
        shapes = jax.eval_shape(train_step(case, mesh), *args)
        hbm = hbm_allocated_bytes(module.buffer_assignment.read_text())
        outcome = {
            "memory": memory_record(compiled.memory_analysis()),
            **({"hbm_bytes": hbm} if hbm is not None else {}),
            "output_shardings": _output_shardings(case, compiled.output_shardings, shapes)["hlo"],
        }
    return {
        "topology": case.tpu_topology,
        "device_kind": str(getattr(devices[0], "device_kind", "")),
        "num_devices": case.mesh.num_devices,
        "compile_seconds": round(compile_seconds, 3),
        **outcome,
        "instruction_shardings": instruction_shardings(read_module(propagated.read_text())),
        "post_partition_while_shapes": while_shapes(module.after_spmd_partitioning.read_text()),
        "pre_propagation_module": pre_propagation,
        "dump_files": [p.name for p in (module.before_propagation, propagated, module.after_spmd_partitioning)],
    }


def _cpu_instruction_shardings(case: Case, module: ModuleDump, hlo_text: str) -> dict[str, Any]:
    """XLA:CPU's shardings after its propagation pass, under NAME.hlo's names where XLA's can be mapped back."""
    xla = read_module(module.after_propagation.read_text())
    shardings = instruction_shardings(xla)
    if case.partitioner != "gspmd":
        # shardy-xla exports the module from MLIR under new names: nothing to map structurally.
        return {"instruction_shardings": shardings, "instruction_shardings_keys": "xla", "name_mapping": None}
    names = source_names(read_module(hlo_text), xla)
    keyed: dict[str, str] = {}
    renamed, unmapped = {}, []
    for name, sharding in shardings.items():
        source = names.get(name)
        if source is None or source in keyed:
            unmapped.append(name)
            source = name
        elif source != name:
            renamed[name] = source
        keyed[source] = sharding
    return {
        "instruction_shardings": keyed,
        "instruction_shardings_keys": "source",
        "name_mapping": {"renamed_by_xla": renamed, "unmapped": unmapped},
    }


def run(case: Case, out_dir: Path, dump_dir: Path, options: RunOptions) -> None:
    started = time.perf_counter()
    import jax
    import jaxlib

    out_dir.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_use_shardy_partitioner", case.partitioner == "shardy")
    devices = jax.devices()
    if len(devices) < case.mesh.num_devices:
        raise RuntimeError(f"{case.name} needs {case.mesh.num_devices} devices, jax sees {len(devices)}")
    mesh = _mesh(case, devices)

    t0 = time.perf_counter()
    lowered, args = _lower(case, mesh)
    hlo_text = lowered.as_text(dialect="hlo", debug_info=True)
    lower_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = lowered.compile()
    compile_seconds = time.perf_counter() - t0

    opt_barriers = count_opcode(hlo_text, "opt-barrier")
    if case.remat is not None and not opt_barriers:
        raise RuntimeError(f"{case.name}: jax.checkpoint left no opt-barrier in the lowered HLO")

    memory = memory_record(compiled.memory_analysis())

    module = largest_module(dump_dir)
    before = module.before_optimizations.read_text()
    lowered_header, body = hlo_text.split("\n", 1)
    # XLA's own header carries the compile options the step was compiled with (num_partitions, which
    # outputs propagation may shard): without them the text does not say how XLA compiled it.
    hlo_text = before.split("\n", 1)[0] + "\n" + body
    by_kind = allocation_bytes_by_kind(module.buffer_assignment.read_text())

    outputs = _output_shardings(case, compiled.output_shardings, jax.eval_shape(train_step(case, mesh), *args))
    params = args[0]
    grads_or_params = "param_output_shardings" if case.optimizer else "grad_output_shardings"

    record: dict[str, Any] = {
        "name": case.name,
        "generator": f"fidelity.run_jax (jax {jax.__version__})",
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "mesh": mesh_record(case),
        "compile_seconds": round(compile_seconds, 3),
        "lower_seconds": round(lower_seconds, 3),
        "memory": memory,
        "tpu": _tpu(case, out_dir, dump_dir, (module.prefix,), options),
        "xla_per_device_total_bytes": sum(by_kind.values()),
        "xla_allocation_bytes_by_kind": by_kind,
        "output_shardings": outputs["hlo"],
        **_cpu_instruction_shardings(case, module, hlo_text),
        "post_partition_while_shapes": while_shapes(module.after_spmd_partitioning.read_text()),
        "after_optimizations_while_shapes": while_shapes(module.after_optimizations.read_text()),
        "params": _args_record(case, args),
        "outputs": outputs["names"],
        "config": case.config(),
        "analysis": {
            "param_shard_shapes": {k: list(v.sharding.shard_shape(v.shape)) for k, v in sorted(params.items())},
            grads_or_params: outputs["per_param"],
        },
        "hlo_header": {
            "replaced": True,
            "lowered_header_attrs": header_attribute_names(lowered_header),
            "xla_header_attrs": header_attribute_names(before),
            "xla_header": before.split("\n", 1)[0],
            "names_equal_to_before_optimizations_dump": instruction_names(hlo_text) == instruction_names(before),
        },
        "opt_barrier_count": opt_barriers,
        "dump_files": [*module.file_names(), module.after_propagation.name],
        "experiment": options.experiment(),
        "process_maxrss_bytes": process_maxrss_bytes(),
        "wall_seconds": round(time.perf_counter() - started, 2),
        "notes": _notes(case, args),
    }
    write_fixture(out_dir, case.name, hlo_text, record)
    (out_dir / f"{case.name}{XLA_DUMP_SUFFIX}").write_text(before)


def set_environment(case: Case, dump_dir: Path, options: RunOptions) -> None:
    os.environ["XLA_FLAGS"] = xla_flags(dump_dir, case.mesh.num_devices, options.dump_all, options.disabled_passes)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # libtpu takes a lock file per process unless told that several may load it: the sweep runs cases side by side.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def main(argv: list[str] | None = None) -> int:
    return runner_main(argv, __doc__.splitlines()[0], "jax", set_environment, run)


if __name__ == "__main__":
    sys.exit(main())

"""Compile a torch_xla module with torch_xla's own XLA, as torch_xla itself compiles a step.

Run as a subprocess (`python -m planner.plan.compilers.torch_xla_compile`), one module per
process: torch_xla reads its device count and XLA's flags once. Reads
`{"hlo": TEXT, "num_devices": N, "parameters": parameter_specs(module)}` as JSON on stdin and prints one JSON line with
XLA's per-device bytes and each While's carried tuple after SPMD partitioning, or jaxlib's refusal of the text
(`planner.plan.compilers.xla_compile.refusal_report`).

Why torch_xla's XLA: it is the compiler that compiles the step. jaxlib compiles
only StableHLO and canonicalizes it on the way back to HLO, which changes
GSPMD's decisions on torch_xla's steps (368.4 MiB per device where torch_xla
measured 633.4 MiB); its XLA:CPU gives torch_xla's bytes only on the faithful
conversion (`planner.plan.compilers.stablehlo`), which is how XLA:TPU is reached. torch_xla
compiles the proto its lowering built; this module gives it the dump's own proto:

1. every entry parameter becomes a device tensor of its shape and element type,
   marked with the parameter's sharding (`mark_sharding` over a mesh that is the
   sharding's own tile assignment, so the device order is kept exactly);
2. the module becomes a user computation called on those tensors
   (`_xla_user_computation`); XLA inlines the call before propagation, so the
   program it partitions is the dump's;
3. the parameters the module donates (`buffer_donor`, as torch_xla writes it for the
   parameters and optimizer state a step updates; `input_output_alias` too) are
   donated again, through torch_xla's own per-tensor donation
   (`_set_buffer_donation`): the call's parameters are otherwise nobody's outputs,
   and XLA would hold every output beside its input (+10% on a transformers Llama
   AdamW step);
4. `torch_xla.sync()` compiles and runs the step, with XLA dumping its buffer
   assignment; the per-device total is the sum of all allocations, which is how
   the corpus records torch_xla's measured bytes (torch_xla has no compiled
   memory statistics API).

The parameters are allocated for real (zeros) on the virtual CPU devices: a
module whose parameters do not fit this machine cannot be verified this way,
and the planner says so before starting the child (`parameters_fit_host`).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from planner.errors import JaxlibRefusedText, Unverifiable
from planner.hlo.ir.module import HloModule
from planner.hlo.ir.shapes import ArrayShape
from planner.memory.donation import buffer_donors, declared_aliases
from planner.plan.compilers.xla_compile import allocated_bytes, partitioned_whiles, refusal_report
from planner.sharding.hlo_sharding import Kind
from planner.units import format_bytes

# Element types torch has a dtype for; a parameter of another type makes the module unverifiable here.
TORCH_DTYPES = {
    "pred": "bool", "s8": "int8", "u8": "uint8", "s16": "int16", "s32": "int32", "s64": "int64",
    "u16": "uint16", "u32": "uint32", "u64": "uint64", "f16": "float16", "bf16": "bfloat16",
    "f32": "float32", "f64": "float64", "c64": "complex64", "c128": "complex128",
}  # fmt: skip


def parameter_specs(module: HloModule) -> list[dict[str, Any]]:
    """Each entry parameter's dims, torch dtype, tile assignment (None: replicated) and whether it is donated.

    Made by the planner from the module it already parsed and sent along with the text, so the
    child process reads no HLO of its own but jaxlib's proto. Raises `Unverifiable` for a parameter
    torch_xla cannot be fed.
    """
    params = sorted(
        (i for i in module.entry.instructions if i.opcode == "parameter"), key=lambda i: i.parameter_number or 0
    )
    donated = {number for number, _ in buffer_donors(module)} | {
        number for number, _ in declared_aliases(module).values()
    }
    specs = []
    for p in params:
        if not isinstance(p.shape, ArrayShape):
            raise Unverifiable(f"entry parameter {p.name} is a tuple; torch_xla passes arrays only")
        dtype = TORCH_DTYPES.get(p.shape.element_type)
        if dtype is None:
            raise Unverifiable(f"entry parameter {p.name} is {p.shape.element_type}, which torch has no dtype for")
        sharding = p.sharding
        tiles: dict[str, Any] | None = None
        if sharding is not None and sharding.kind is Kind.TILED and not sharding.is_replicated:
            if sharding.subgroup_types:
                raise Unverifiable(f"entry parameter {p.name} has subgroup sharding {sharding.to_text()}")
            assert sharding.tile_assignment is not None
            tiles = {
                "dims": list(sharding.tile_assignment.dims),
                "devices": list(sharding.tile_assignment.flat_devices),
            }
        elif sharding is not None and not (sharding.is_replicated or sharding.is_unknown):
            raise Unverifiable(f"entry parameter {p.name} has sharding {sharding.to_text()}")
        specs.append({"name": p.name, "dims": list(p.shape.dims), "dtype": dtype, "tiles": tiles,
                      "bytes": p.shape.byte_size, "donated": p.parameter_number in donated})  # fmt: skip
    return specs


def parameters_fit_host(specs: list[dict[str, Any]], num_devices: int, budget_bytes: int) -> int:
    """Bytes the virtual devices need for the parameters (each device holds its shard, or all of a replica)."""
    total = 0
    for s in specs:
        replicas = num_devices
        if s["tiles"] is not None:
            # A tiled parameter is held once over all devices (replicated tile dims add copies).
            data_tiles = 1
            for d in s["tiles"]["dims"][: len(s["dims"])]:
                data_tiles *= d
            replicas = num_devices // data_tiles
        total += s["bytes"] * replicas
    if total > budget_bytes:
        raise Unverifiable(
            f"its parameters need {format_bytes(total)} on {num_devices} virtual devices, more than this "
            f"machine can lend ({format_bytes(budget_bytes)})"
        )
    return total


def _inputs(specs: list[dict[str, Any]]) -> list[Any]:
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs

    tensors = []
    for s in specs:
        t = torch.zeros(s["dims"], dtype=getattr(torch, s["dtype"])).to(torch_xla.device())
        if s["tiles"] is not None:
            # A mesh shaped like the tile assignment, each tensor dim on its own axis: the sharding
            # mark_sharding builds is then exactly the parameter's (extra axes are replication).
            dims = tuple(s["tiles"]["dims"])
            mesh = xs.Mesh(np.array(s["tiles"]["devices"]), dims, tuple(f"t{i}" for i in range(len(dims))))
            xs.mark_sharding(t, mesh, tuple(f"t{i}" for i in range(len(s["dims"]))))
        tensors.append(t)
    return tensors


def compile_step(text: str, specs: list[dict[str, Any]], num_devices: int, dump_dir: str) -> dict[str, Any]:
    import torch_xla
    import torch_xla.runtime as xr

    from planner.hlo.text import jaxlib_api
    from planner.hlo.text.proto_ids import separate_computation_ids

    xr.use_spmd()
    inputs = _inputs(specs)
    torch_xla.sync()
    if any(s["donated"] for s in specs):
        # A sync donates the buffers marked for donation, and XLA pairs them with outputs by its own rule, as
        # it did for the step the module was dumped from.
        torch_xla._XLAC._xla_set_enable_alias_with_buffer_donor_config(True)
        for tensor, spec in zip(inputs, specs):
            torch_xla._XLAC._set_buffer_donation(tensor, spec["donated"])
    # jaxlib's parser builds the proto torch_xla's lowering would have; both XLAs read the same proto.
    proto = jaxlib_api.hlo_proto(text)
    computation = torch_xla._XLAC._xla_op_computation_from_module_proto("verify", separate_computation_ids(proto))
    start = time.perf_counter()
    outputs = torch_xla._XLAC._xla_user_computation("xla::verify", inputs, computation)
    torch_xla.sync()
    seconds = time.perf_counter() - start
    del outputs
    step = _step_files(Path(dump_dir))
    assignment = step.with_name(
        step.name.replace("before_optimizations.txt", "cpu_after_optimizations-buffer-assignment.txt")
    )
    total = allocated_bytes(assignment.read_text())
    partitioned = sorted(
        Path(dump_dir).glob(step.name.replace("before_optimizations.txt", "*after_spmd-partitioning*.txt"))
    )
    whiles = partitioned_whiles(partitioned[-1].read_text()) if partitioned else []
    return {
        "xla": f"torch_xla {torch_xla.__version__} (its own XLA, GSPMD on {num_devices} virtual CPU devices)",
        "total_bytes": total,
        "while_shapes": whiles,
        "seconds": round(seconds, 3),
    }  # fmt: skip


def _step_files(dump_dir: Path) -> Path:
    """The step's before_optimizations file: the largest module, the input transfers around it are tiny."""
    candidates = list(dump_dir.glob("module_*.before_optimizations.txt"))
    if not candidates:
        raise RuntimeError(f"torch_xla compiled nothing into {dump_dir}")
    return max(candidates, key=lambda p: p.stat().st_size)


def host_budget_bytes() -> int:
    """Half of the memory this machine has available now: the step runs beside the planner."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // 2
    except OSError:
        pass
    return 4 << 30


def main() -> int:
    request = json.load(sys.stdin)
    n = int(request["num_devices"])
    text, specs = request["hlo"], request["parameters"]
    with tempfile.TemporaryDirectory(prefix="spmd-planner-torch-xla-") as dump:
        os.environ.update(
            PJRT_DEVICE="CPU",
            CPU_NUM_DEVICES=str(n),
            XLA_FLAGS=f"--xla_dump_to={dump} --xla_dump_hlo_as_text --xla_dump_hlo_pass_re=spmd-partitioning",
        )
        try:
            report = compile_step(text, specs, n, dump)
        except JaxlibRefusedText as e:
            report = refusal_report(e)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

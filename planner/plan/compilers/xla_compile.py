"""Compile one HLO module with real XLA's SPMD pipeline and report what it decided.

Run as a subprocess (`python -m planner.plan.compilers.xla_compile`), one module per
process: XLA reads its flags (device count, dump folder) once per process.
Reads `{"hlo": TEXT, "num_devices": N, "allow_output": BOOL or [BOOL, ...], "tpu_topology": T,
"partitioner": "gspmd" or "shardy"}` as JSON on stdin and prints one JSON line: XLA's version, compiled memory
statistics (bytes per device), XLA:CPU's buffer allocations and each While's
carried tuple per device right after SPMD partitioning; or `{"unfaithful":
REASON}` for a module jaxlib cannot be given as it is (`UnfaithfulConversion`), or
`{"refused": {...}}` for text jaxlib's parser refuses (`refusal_report`).
Needs jaxlib (the `xla` extra). With `tpu_topology` (e.g. `v6e:2x4`, needs
libtpu from the `tpu` extra) XLA:TPU compiles it ahead of time for that slice,
with no TPU attached: the bytes a user's chip will see. This is the one place
the planner asks jaxlib's compilers; the reference sweep's TPU numbers come
from the same libtpu through JAX's ahead-of-time API.

jaxlib compiles only StableHLO, and its compile path canonicalizes the MLIR
before it exports it back to HLO (`stablehlo_for`). A JAX module has been
through that path already (JAX lowers to StableHLO, and its dump is what the
path exported), so it goes through `hlo_to_stablehlo` alone, as JAX's own
compile takes it: on the corpus's JAX step the faithful conversion gives the
same bytes and While shapes on XLA:CPU and XLA:TPU, and it refuses the pinned
step (an identity reshape carrying a sharding) that this way compiles. A
torch_xla module never was (torch_xla hands XLA its proto), and the rewrites
change GSPMD's decisions; it goes through the faithful conversion
(`planner.plan.compilers.stablehlo`), which comes back from the canonicalizer unchanged.
A request may name the conversion (`"conversion": "faithful"` or `"plain"`).
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.errors import JaxlibRefusedText, UnfaithfulConversion

PARTITIONERS = ("gspmd", "shardy")
_WHILE = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\(.*?\)) while\(", re.MULTILINE)
# An allocation's size, and its memory space where that is not the default (XLA prints `color N` only then).
_ALLOCATION = re.compile(r"^allocation \d+: size (\d+)(?:, color (\d+))?", re.MULTILINE)


def partitioned_whiles(text: str) -> list[dict[str, str]]:
    """Each While of a module XLA dumped right after SPMD partitioning: its name and per-device tuple shape."""
    return [{"name": m.group(1), "shape": m.group(2)} for m in _WHILE.finditer(text)]


def allocated_bytes(buffer_assignment: str) -> int:
    """The sum of all allocations of an XLA buffer-assignment dump: how the corpus records torch_xla's bytes."""
    return sum(int(size) for size, _ in _ALLOCATION.findall(buffer_assignment))


def hbm_allocated_bytes(buffer_assignment: str) -> int | None:
    """What an XLA:TPU buffer-assignment dump allocates in HBM, the default memory space (color 0): the
    parameters' allocations beside the temporaries' heap, without the on-chip VMEM (color 1). It is the total
    XLA:TPU checks against the chip (its out-of-memory error quotes it) and its memory-usage report's for
    that space; the compiled statistics' temp size adds VMEM and bytes no allocation accounts for."""
    sizes = [int(size) for size, color in _ALLOCATION.findall(buffer_assignment) if color in ("", "0")]
    return sum(sizes) if sizes else None


@dataclass(frozen=True)
class StableHlo:
    """The StableHLO a module is compiled from, and how it was made (`stablehlo_for`)."""

    mlir: bytes
    # "faithful" (planner.plan.compilers.stablehlo) or "plain" (hlo_to_stablehlo alone).
    conversion: str
    # What the faithful conversion did (FaithfulStableHlo.summary); empty for the plain one.
    summary: Mapping[str, int]


def stablehlo_for(text: str, conversion: str | None = None, partitioner: str = "gspmd") -> StableHlo:
    """A torch_xla module through the faithful conversion, a JAX module as JAX's compile takes it; with
    Shardy, its shardings in the `sdy` dialect as JAX writes them (`planner.plan.compilers.shardy_stablehlo`).

    `conversion` ("faithful" or "plain") overrides the choice. Raises `UnfaithfulConversion` for a
    module the faithful conversion cannot keep.
    """
    from planner.hlo.structure.frontend import is_torch_xla_module
    from planner.hlo.text.parser import parse_hlo
    from planner.plan.compilers.shardy_stablehlo import import_shardy
    from planner.plan.compilers.stablehlo import faithful_stablehlo, plain_stablehlo

    if conversion not in (None, "faithful", "plain"):
        raise ValueError(f"conversion must be 'faithful' or 'plain', not {conversion!r}")
    module = parse_hlo(text)
    if conversion == "plain" or (conversion is None and not is_torch_xla_module(module)):
        converted = StableHlo(plain_stablehlo(text), "plain", {})
    else:
        faithful = faithful_stablehlo(module)
        converted = StableHlo(faithful.mlir, "faithful", faithful.summary())
    if partitioner != "shardy":
        return converted
    return StableHlo(import_shardy(converted.mlir, module), converted.conversion, converted.summary)


def compile_spmd(
    text: str,
    num_devices: int,
    allow_output: bool | tuple[bool, ...] = False,
    tpu_topology: str | None = None,
    conversion: str | None = None,
    partitioner: str = "gspmd",
) -> tuple[Any, float]:
    """(executable, seconds): text -> HloModule -> StableHLO (`stablehlo_for`) -> SPMD program for `num_devices`.

    CPU devices unless `tpu_topology` names a TPU slice libtpu describes. XLA reads its CPU device
    count when jax first starts: set `--xla_force_host_platform_device_count` in XLA_FLAGS first.
    The seconds are the compile's, from StableHLO on (the faithful conversion takes about one more).
    """
    executable, seconds, _ = _compile(text, num_devices, allow_output, tpu_topology, conversion, partitioner)
    return executable, seconds


def _compile(
    text: str,
    num_devices: int,
    allow_output: bool | tuple[bool, ...],
    tpu_topology: str | None,
    conversion: str | None,
    partitioner: str = "gspmd",
) -> tuple[Any, float, StableHlo]:
    import jax
    from jax._src import compiler, xla_bridge
    from jax._src.lib import xla_client

    if partitioner not in PARTITIONERS:
        raise ValueError(f"partitioner must be one of {', '.join(PARTITIONERS)}, not {partitioner!r}")
    # The partitioner the module names is the one its user's compile runs (JAX's default is Shardy).
    shardy = partitioner == "shardy"
    jax.config.update("jax_use_shardy_partitioner", shardy)
    stablehlo = stablehlo_for(text, conversion, partitioner)
    start = time.perf_counter()
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
        num_replicas=1, num_partitions=num_devices, device_assignment=np.array(chosen).reshape(1, num_devices)
    )
    build = options.executable_build_options
    # jax 0.7.1 took this as an argument (default on); newer jax sets it on the build options itself.
    build.use_spmd_partitioning = True
    build.use_shardy_partitioner = shardy
    # One flag for every output, or one per output as JAX passes them (params and optimizer state pinned,
    # gradients free): XLA reads a list of one as applying to all.
    flags = [allow_output] if isinstance(allow_output, bool) else list(allow_output)
    if any(flags):
        build.allow_spmd_sharding_propagation_to_output = flags
    mlir = stablehlo.mlir
    if not isinstance(allow_output, bool):
        from planner.plan.compilers.free_outputs import unpin_free_outputs

        mlir = unpin_free_outputs(mlir, allow_output)
    executable = compile_fn(_compilable(mlir), xla_client.DeviceList(chosen), options)
    return executable, time.perf_counter() - start, stablehlo


def _compilable(mlir: bytes) -> Any:
    """The module as the installed jaxlib's `compile` takes it: bytecode up to jax 0.7, a parsed `ir.Module`
    (what JAX itself hands over) on releases whose compile-only client refuses bytes."""
    from planner.hlo.text.jaxlib_api import jaxlib_version

    if jaxlib_version() < (0, 8):
        return mlir
    from jax._src.interpreters import mlir as jax_mlir
    from jaxlib.mlir import ir

    with jax_mlir.make_ir_context():
        return ir.Module.parse(mlir)


def _flags(value: object) -> bool | tuple[bool, ...]:
    """The request's `allow_output`: one flag, or a list of one per output."""
    return tuple(bool(v) for v in value) if isinstance(value, list) else bool(value)


def _libtpu_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("libtpu")
    except PackageNotFoundError:
        return "unknown"


def memory_total(executable: Any) -> int:
    """argument + output + temp - alias bytes per device, from compiled memory stats."""
    return stats_total(executable.get_compiled_memory_stats())


def stats_total(stats: Any) -> int:
    """argument + output + temp - alias bytes per device of one `CompiledMemoryStats` (a jaxlib executable's,
    or a JAX `Compiled`'s `memory_analysis()`)."""
    return int(
        stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes - stats.alias_size_in_bytes
    )


def _output_shardings(executable: Any) -> list[str] | None:
    """The sharding XLA gave each output leaf, as HloSharding text (what the SPMD partitioner made of the
    module, whichever propagation decided it); None where this jaxlib's executable does not say."""
    try:
        shardings = executable.get_output_shardings()
    except Exception:  # absent or unimplemented on an executable kind: the report says nothing
        return None
    if shardings is None:
        return None
    from jax._src.lib import xla_client

    return [str(xla_client.HloSharding.from_proto(op)) for op in shardings]


def refusal_report(e: JaxlibRefusedText) -> dict[str, Any]:
    """What a child reports of text its jaxlib's parser refused: the reason, where, and which jaxlib refused
    it (`planner.plan.compilers.jax_releases` tells the parent which release wrote the text)."""
    import jaxlib

    return {"refused": {"reason": e.reason, "line": e.line, "column": e.column, "line_text": e.line_text,
                        "jaxlib": jaxlib.__version__}}  # fmt: skip


def main() -> int:
    request = json.load(sys.stdin)
    with tempfile.TemporaryDirectory(prefix="spmd-planner-xla-") as dump:
        try:
            report = _compile_report(request, dump)
        except UnfaithfulConversion as e:
            report = {"unfaithful": str(e)}
        except JaxlibRefusedText as e:
            report = refusal_report(e)
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

    partitioner = request.get("partitioner") or "gspmd"
    executable, seconds, stablehlo = _compile(
        request["hlo"], n, _flags(request.get("allow_output")), topology, request.get("conversion"), partitioner
    )
    named = "Shardy" if partitioner == "shardy" else "GSPMD"
    stats = executable.get_compiled_memory_stats()
    output_shardings = _output_shardings(executable)
    whiles = []
    # XLA:CPU's pass is spmd-partitioning, XLA:TPU's tpu-spmd-partitioning. Not `*after_*spmd-partitioning*`:
    # that also matches XLA:TPU's much later `tpu-sparse-core-hierarchical-spmd-partitioning`, whose
    # loops the post-partitioning passes have already changed (a torch_xla min-cut step's backward
    # loop: 40 elements there, 50 after tpu-spmd-partitioning).
    partitioned = sorted(
        glob.glob(os.path.join(dump, "*.after_spmd-partitioning.*.txt"))
        + glob.glob(os.path.join(dump, "*.after_tpu-spmd-partitioning.*.txt"))
    )
    if partitioned:
        with open(partitioned[-1]) as f:
            whiles = partitioned_whiles(f.read())
    # Each compiler dumps its buffer assignment; the largest one is the step's (the others move inputs).
    # XLA:CPU's holds what the corpus records of torch_xla; XLA:TPU's, the HBM the step holds per chip.
    pattern = (
        "*after_optimizations-buffer-assignment.txt" if topology else "*cpu_after_optimizations-buffer-assignment.txt"
    )
    assignments = glob.glob(os.path.join(dump, pattern))
    allocated = hbm = None
    if assignments:
        with open(max(assignments, key=os.path.getsize)) as f:
            text = f.read()
        if topology:
            hbm = hbm_allocated_bytes(text)
        else:
            allocated = allocated_bytes(text)
    return {
        "xla": f"jaxlib {jaxlib.__version__} " + (
            f"(XLA:TPU, libtpu {_libtpu_version()}, {named} ahead of time for {topology})"
            if topology else f"(XLA {named} on {n} virtual CPU devices)"
        ),
        "partitioner": partitioner,
        "stablehlo": stablehlo.conversion,
        "conversion": dict(stablehlo.summary),
        # XLA:TPU's HBM where its buffer assignment says it, else the statistics' argument + output + temp - alias.
        "total_bytes": hbm if hbm is not None else memory_total(executable),
        "argument_bytes": int(stats.argument_size_in_bytes),
        "output_bytes": int(stats.output_size_in_bytes),
        "temp_bytes": int(stats.temp_size_in_bytes),
        "alias_bytes": int(stats.alias_size_in_bytes),
        "allocated_bytes": allocated,
        "hbm_bytes": hbm,
        "while_shapes": whiles,
        "output_shardings": output_shardings,
        "seconds": round(seconds, 3),
    }  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

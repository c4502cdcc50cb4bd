"""Verify a plan with real XLA: compile the original and the patched module, compare.

Each module is compiled by XLA's SPMD pipeline (jaxlib, on virtual CPU
devices) in a subprocess of its own, with a time limit, so a crash or hang
in XLA cannot take the planner with it. Reported next to the prediction:
XLA's bytes per device before and after, and whether every stacked gradient
of the patched module's partitioned While loops is at its parameter's shard.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time

from planner.errors import PlanningError
from planner.hlo.compat import for_jaxlib_0_7
from planner.hlo.ir import HloModule
from planner.hlo.printer import print_module
from planner.hlo.scanner import Cursor
from planner.hlo.shapes import TupleShape, parse_shape
from planner.plan.model import Plan, TpuVerification, Verification
from planner.plan.scan_pairs import StackedGradient

TIME_LIMIT_SECONDS = 600


def compile_with_xla(
    text: str,
    num_devices: int,
    allow_output: bool,
    timeout: float = TIME_LIMIT_SECONDS,
    tpu_topology: str | None = None,
) -> dict:
    """XLA's report for one module (see `xla_compile`): XLA:CPU, or XLA:TPU for `tpu_topology`."""
    request = json.dumps({"hlo": for_jaxlib_0_7(text), "num_devices": num_devices, "allow_output": allow_output,
                          "tpu_topology": tpu_topology})  # fmt: skip
    try:
        done = subprocess.run(
            [sys.executable, "-m", "planner.plan.xla_compile"],
            input=request,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise PlanningError(f"XLA did not finish compiling within {timeout:.0f} s") from e
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        if "No module named 'jax" in done.stderr:
            tail = "jaxlib is not installed: install the `xla` extra (pip install 'spmd-planner[xla]')"
        elif tpu_topology and "libtpu" in done.stderr.lower() and "not found" in done.stderr.lower():
            tail = "libtpu is not installed: install the `tpu` extra (pip install 'spmd-planner[tpu]')"
        raise PlanningError(f"XLA could not compile the module: {tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def allows_output_propagation(module: HloModule) -> bool:
    """Whether the module's header lets propagation shard its outputs, as the compile it came from did."""
    return any(module.attr("allow_spmd_sharding_propagation_to_output") or ())


def libtpu_installed() -> bool:
    return importlib.util.find_spec("libtpu") is not None


def verify(
    original: HloModule,
    patched: HloModule,
    plan: Plan,
    gradients: list[StackedGradient],
    num_devices: int,
    tpu_topology: str | None = None,
) -> Verification:
    """XLA:CPU compiles both modules; with `tpu_topology` (and libtpu installed) XLA:TPU does too."""
    allow_output = allows_output_propagation(original)
    start = time.perf_counter()
    before = compile_with_xla(print_module(original), num_devices, allow_output)
    after = compile_with_xla(print_module(patched), num_devices, allow_output)
    mismatches = gradient_mismatches(after["while_shapes"], patched, gradients)
    tpu = None
    if tpu_topology is not None and libtpu_installed():
        tpu_before = compile_with_xla(print_module(original), num_devices, allow_output, tpu_topology=tpu_topology)
        tpu_after = compile_with_xla(print_module(patched), num_devices, allow_output, tpu_topology=tpu_topology)
        tpu = TpuVerification(
            xla=tpu_after["xla"],
            topology=tpu_topology,
            before_total_bytes=tpu_before["total_bytes"],
            after_total_bytes=tpu_after["total_bytes"],
            xla_saving_bytes=tpu_before["total_bytes"] - tpu_after["total_bytes"],
        )
    return Verification(
        xla=after["xla"],
        num_devices=num_devices,
        before_total_bytes=before["total_bytes"],
        after_total_bytes=after["total_bytes"],
        predicted_saving_bytes=plan.hbm.total_before - plan.hbm.total_after,
        xla_saving_bytes=before["total_bytes"] - after["total_bytes"],
        after_while_shapes=[w["shape"] for w in after["while_shapes"]],
        stacked_gradients_at_shard=not mismatches,
        gradient_mismatches=mismatches,
        tpu=tpu,
        seconds=round(time.perf_counter() - start, 3),
    )


def gradient_mismatches(xla_whiles: list[dict], module: HloModule, gradients: list[StackedGradient]) -> list[str]:
    """Stacked gradients whose per-device shape in XLA's partitioned loops exceeds their parameter's shard.

    XLA renames loops when it partitions; a loop is found again by the arity of its carried tuple.
    """
    parsed = [parse_shape(Cursor(w["shape"]), {}) for w in xla_whiles]
    problems = []
    for g in gradients:
        if g.ideal is None:
            continue
        arity = len(module.instruction(g.loop).shape.leaves())
        matches = [s for s in parsed if isinstance(s, TupleShape) and len(s.leaves()) == arity]
        if len(matches) != 1:
            problems.append(f"{g.key}: {len(matches)} partitioned loops carry {arity} elements")
            continue
        got = matches[0].leaves()[g.index].dims
        want = g.ideal.shard_shape(g.shape.dims)
        if tuple(got) != tuple(want) and g.shape.bytes_for_dims(got) > g.shape.bytes_for_dims(want):
            problems.append(
                f"{g.key} {g.shape.to_text(False)}: XLA keeps {list(got)} per device, shard is {list(want)}"
            )
    return problems

"""One candidate in one process: lowered and planned (`evaluate`), or compiled with its plan (`confirm`).

Both run where the search puts them (a Ray task, or this process), with XLA's CPU device count set for
the candidate before JAX starts. The step builder is `build(candidate, mesh) -> (loss_fn, params, batch)`:
`params` and `batch` (a tuple) abstract or real, their shardings over `mesh`, and `loss_fn` scanning its
layers with `scan_runtime.jax.scan` so the plan can pin them (it reads the plan `confirm` makes active,
`planner.plan.jax_terms.use_plan`). A candidate that cannot be built, lowered
or planned (a mesh axis that does not divide a dim) is a result with the error, not a failed search.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from planner.search.candidates import Candidate

StepBuilder = Callable[[Candidate, Any], tuple[Callable[..., Any], Any, tuple[Any, ...]]]


@dataclass(frozen=True)
class Evaluation:
    """What the planner predicts for one candidate, with the plan's recommended pins applied."""

    candidate: Candidate
    capacity_bytes: int | None = None
    predicted_before_bytes: int | None = None
    predicted_after_bytes: int | None = None
    # Dot FLOPs per device per step of the planned module (`planner.plan.cost`): remat's recompute included.
    flops_per_device: int | None = None
    pinned: tuple[str, ...] = ()
    plan_json: str | None = None
    seconds: float = 0.0
    error: str | None = None

    @property
    def headroom_bytes(self) -> int | None:
        if self.capacity_bytes is None or self.predicted_after_bytes is None:
            return None
        return self.capacity_bytes - self.predicted_after_bytes

    @property
    def flops_per_batch(self) -> int | None:
        """Dot FLOPs per device for the global batch: one step per microbatch."""
        return None if self.flops_per_device is None else self.flops_per_device * self.candidate.microbatches

    @property
    def fits(self) -> bool:
        return self.headroom_bytes is not None and self.headroom_bytes >= 0


@dataclass(frozen=True)
class Confirmation:
    """The chip's compiler (or XLA:CPU without libtpu) on the candidate's step with its plan applied."""

    candidate: Candidate
    compiler: str
    compiled_bytes: int | None = None
    seconds: float = 0.0
    error: str | None = None


def load_builder(spec: str) -> StepBuilder:
    """The step builder `MODULE:FUNCTION` names, imported from here (the working directory first)."""
    module_name, sep, function = spec.partition(":")
    if not sep or not module_name or not function:
        raise ValueError(f"step builder {spec!r} is not MODULE:FUNCTION")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # "importable from here", as `python -m` would have it
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import {module_name!r} for the step builder: {e}") from None
    build = getattr(module, function, None)
    if not callable(build):
        raise ValueError(f"{module_name} has no function {function!r}")
    return build


def cpu_mesh(candidate: Candidate) -> Any:
    """The candidate's mesh over this process's (virtual CPU) devices."""
    import jax

    return candidate_mesh(candidate, jax.devices())


def candidate_mesh(candidate: Candidate, devices: Any) -> Any:
    """The candidate's mesh over the first of `devices`, in order (jit numbers them so)."""
    import numpy as np
    from jax.sharding import Mesh

    if len(devices) < candidate.num_devices:
        raise ValueError(f"{candidate.label()} needs {candidate.num_devices} devices, there are {len(devices)}")
    return Mesh(np.array(devices[: candidate.num_devices]).reshape(candidate.mesh_shape), candidate.axis_names)


def evaluate(build: StepBuilder, candidate: Candidate) -> Evaluation:
    """Lower the candidate's step from its abstract inputs and plan it for the candidate's chip."""
    start = time.perf_counter()
    try:
        return _evaluate(build, candidate, start)
    except Exception as e:  # a candidate's own failure is its result; the search goes on
        return Evaluation(candidate, seconds=time.perf_counter() - start, error=_reason(e))


def _evaluate(build: StepBuilder, candidate: Candidate, start: float) -> Evaluation:
    from planner.hlo.text.parser import parse_hlo
    from planner.memory import chip as chip_preset
    from planner.mesh import to_planner_mesh
    from planner.passes import Planning, Preparation
    from planner.plan.cost import dot_flops_per_device
    from planner.plan.jax_terms import lower_step
    from planner.propagation import propagate

    mesh = cpu_mesh(candidate)
    loss_fn, params, batch = build(candidate, mesh)
    text, manifest = lower_step(loss_fn, params, *batch)
    capacity = chip_preset(candidate.chip).hbm_bytes
    planner_mesh = to_planner_mesh(mesh)
    prepared = Preparation(candidate.chip, planner_mesh).apply(parse_hlo(text, source=candidate.label()))
    plan, patched = Planning(capacity, manifest=manifest).apply(prepared)
    planned = Preparation(candidate.chip, planner_mesh).apply(patched)
    pinned = tuple(p.torch.parameter for p in plan.placements if p.recommended and p.torch is not None)
    return Evaluation(
        candidate,
        capacity_bytes=capacity,
        predicted_before_bytes=plan.hbm.total_before,
        predicted_after_bytes=plan.hbm.total_after,
        flops_per_device=dot_flops_per_device(planned.module, propagate(planned)),
        pinned=pinned,
        plan_json=plan.model_dump_json(),
        seconds=time.perf_counter() - start,
    )


def confirm(build: StepBuilder, evaluation: Evaluation) -> Confirmation:
    """Compile the candidate's step with its plan active: XLA:TPU ahead of time for the chip's slice where
    libtpu is installed, else XLA:CPU on this process's virtual devices."""
    candidate = evaluation.candidate
    start = time.perf_counter()
    try:
        compiler, total = _compile(build, evaluation)
    except Exception as e:
        return Confirmation(candidate, "", seconds=time.perf_counter() - start, error=_reason(e))
    return Confirmation(candidate, compiler, total, seconds=time.perf_counter() - start)


def _compile(build: StepBuilder, evaluation: Evaluation) -> tuple[str, int]:
    import jax

    from planner.plan.compilers.verify import libtpu_installed
    from planner.plan.compilers.xla_compile import stats_total
    from planner.plan.jax_terms import JaxPlan, step_manifest, use_plan
    from planner.plan.model import Plan
    from planner.targets import backend, tpu_topology

    candidate = evaluation.candidate
    topology = tpu_topology(candidate.chip, candidate.num_devices)
    if backend(candidate.chip).compiler == "tpu" and topology is not None and libtpu_installed():
        from jax.experimental import topologies

        mesh = candidate_mesh(candidate, topologies.get_topology_desc(platform="tpu", topology_name=topology).devices)
        compiler = f"XLA:TPU ({topology})"
    else:
        mesh = cpu_mesh(candidate)
        compiler = "XLA:CPU"
    loss_fn, params, batch = build(candidate, mesh)
    plan = None
    if evaluation.plan_json is not None:
        plan = JaxPlan.from_plan(Plan.model_validate_json(evaluation.plan_json), mesh, step_manifest(params))
    with use_plan(plan):
        compiled = jax.jit(jax.value_and_grad(loss_fn)).lower(params, *batch).compile()
    stats = compiled.memory_analysis()
    if stats is None:
        raise RuntimeError(f"{compiler} reports no memory statistics for the compiled step")
    return compiler, stats_total(stats)


def _reason(e: Exception) -> str:
    """The exception's message and where it was raised in the caller's code (its last frame)."""
    frames = traceback.extract_tb(e.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(e).__name__}: {e}{where}"

"""`search`: which configuration of a JAX step fits, with the most headroom and the least compute.

Every candidate is lowered and planned at simulation speed, each in a Ray task; the best `top_k` are then
compiled by the chip's compiler (XLA:TPU ahead of time through libtpu, XLA:CPU without it), also in Ray
tasks, and the report puts predicted and compiled bytes side by side. Ranking: candidates predicted to
fit come first, by dot FLOPs per device for the global batch (`Evaluation.flops_per_batch`: one step's
dots, remat's recompute included, times the microbatches it takes; the cheaper configuration trains
faster), ties by the larger headroom; then those that do not fit, closest first; then those that
failed, with the reason.

Ray: a local Ray (`ray.init()`) unless `ray_address` names a cluster. JAX reads its CPU device count
once per process, so each task carries it in its runtime environment (Ray keeps a worker per
environment). Lowering and compiling are memory-heavy: each task asks for `memory` bytes of Ray's
memory resource (clamped to what the cluster has), so a node runs no more of them than it can hold.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from planner.search.candidates import Candidate
from planner.search.evaluate import Confirmation, Evaluation, StepBuilder, confirm, evaluate
from planner.search.ray_tasks import driver_path, task_memory

GIB = 1 << 30
# Peak resident memory of one task, measured on this project's steps: lowering and planning a
# 405B-shaped step for 256 devices stays under 3 GiB; XLA:TPU's compile of it under 8 GiB.
EVALUATE_MEMORY_BYTES = 3 * GIB
CONFIRM_MEMORY_BYTES = 8 * GIB

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class SearchReport:
    ranked: tuple[Evaluation, ...]
    confirmed: tuple[Confirmation, ...]

    def best(self) -> Evaluation | None:
        return next((e for e in self.ranked if e.fits), None)

    def confirmation(self, candidate: Candidate) -> Confirmation | None:
        return next((c for c in self.confirmed if c.candidate == candidate), None)

    def best_confirmed(self) -> tuple[Evaluation, Confirmation] | None:
        """The best-ranked candidate the compiler also fits in the chip's capacity."""
        for e in self.ranked:
            c = self.confirmation(e.candidate)
            compiled = c.compiled_bytes if c is not None else None
            if c is not None and compiled is not None and e.capacity_bytes is not None and compiled <= e.capacity_bytes:
                return e, c
        return None


def rank(evaluations: Sequence[Evaluation]) -> list[Evaluation]:
    """Fitting candidates by FLOPs per device per global batch then headroom, then the others by headroom,
    then failures."""

    def key(e: Evaluation) -> tuple[int, int, int]:
        if e.error is not None or e.headroom_bytes is None:
            return (2, 0, 0)
        if e.fits:
            return (0, e.flops_per_batch or 0, -e.headroom_bytes)
        return (1, -e.headroom_bytes, 0)

    return sorted(evaluations, key=key)


def search(
    build: StepBuilder,
    candidates: Sequence[Candidate],
    top_k: int = 3,
    ray_address: str | None = None,
    num_cpus: int | None = None,
    evaluate_memory_bytes: int = EVALUATE_MEMORY_BYTES,
    confirm_memory_bytes: int = CONFIRM_MEMORY_BYTES,
    progress: Progress | None = None,
) -> SearchReport:
    """Plan every candidate of `build` on Ray, rank them, and compile the best `top_k` that fit."""
    import ray

    if not candidates:
        raise ValueError("the search has no candidates")
    started_here = not ray.is_initialized()
    if started_here:
        # Ray's notice that it will stop hiding accelerators from CPU-only tasks: these tasks want none.
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
        ray.init(address=ray_address, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR")  # fmt: skip
    try:
        evaluations = _run_all(
            "planned", evaluate, [(build, c) for c in candidates], candidates, evaluate_memory_bytes, progress
        )
        ranked = rank(evaluations)
        best = [e for e in ranked if e.fits][:top_k]
        confirmed = _run_all(
            "compiled", confirm, [(build, e) for e in best], [e.candidate for e in best], confirm_memory_bytes, progress
        )
    finally:
        if started_here:
            ray.shutdown()
    return SearchReport(tuple(ranked), tuple(confirmed))


def _run_all(
    what: str,
    work: Callable[..., Any],
    arguments: list[tuple[Any, ...]],
    candidates: Sequence[Candidate],
    memory_bytes: int,
    progress: Progress | None,
) -> list[Any]:
    """`work(*args)` for each argument tuple as a Ray task; results in submission order."""
    import ray

    if not arguments:
        return []
    task = ray.remote(work)
    memory = task_memory(memory_bytes)
    refs = [
        task.options(num_cpus=1, memory=memory, runtime_env=_environment(c.num_devices)).remote(*args)
        for args, c in zip(arguments, candidates)
    ]
    pending, done = list(refs), 0
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        done += len(ready)
        if progress is not None:
            progress(what, done, len(refs))
    return list(ray.get(refs))


def _environment(num_devices: int) -> dict[str, Any]:
    """A worker's environment: JAX on `num_devices` virtual CPU devices, and the driver's import path (the
    step builder's module must import in the worker as it does here)."""
    return {"env_vars": {"XLA_FLAGS": f"--xla_force_host_platform_device_count={num_devices}",
                         "JAX_PLATFORMS": "cpu", "PYTHONPATH": driver_path(),
                         # libtpu locks a file per process unless told several processes may load it.
                         "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}}  # fmt: skip


def terminal_progress(what: str, done: int, total: int) -> None:
    """A progress bar on standard error: `planned [#####.....] 5/10`."""
    width = 30
    filled = width * done // total
    end = "\n" if done == total else ""
    print(f"\r{what:8s} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}", end=end, file=sys.stderr, flush=True)


def report_body(report: SearchReport, builder: str) -> Any:
    """The report as the service stores it (`planner.wire.SearchReportBody`), best first."""
    from planner.wire import SearchReportBody, SearchRow

    rows = []
    for e in report.ranked:
        c = report.confirmation(e.candidate)
        rows.append(SearchRow(
            candidate=e.candidate.label(), capacity_bytes=e.capacity_bytes,
            predicted_after_bytes=e.predicted_after_bytes, headroom_bytes=e.headroom_bytes,
            flops_per_batch=e.flops_per_batch, pinned=list(e.pinned), error=e.error,
            compiler=c.compiler if c is not None and c.error is None else None,
            compiled_bytes=c.compiled_bytes if c is not None else None,
            compile_error=c.error if c is not None else None,
        ))  # fmt: skip
    return SearchReportBody(builder=builder, rows=rows)


def post_report(url: str, body: Any, token: str | None = None, timeout: float = 60.0) -> str:
    """Store the report on the service at `url`; returns the address of its dashboard page."""
    import json
    import urllib.error
    import urllib.request

    from planner.wire import PlannerRefused, PlannerUnavailable

    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"{url.rstrip('/')}/searches", body.model_dump_json().encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            search_id = json.loads(response.read())["id"]
    except urllib.error.HTTPError as e:
        raise PlannerRefused(f"the planner at {url} answered {e.code} to the search report") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
        raise PlannerUnavailable(f"cannot reach the planner service at {url}: {getattr(e, 'reason', e)}") from None
    return f"{url.rstrip('/')}/searches/{search_id}/view"

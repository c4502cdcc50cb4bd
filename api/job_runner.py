"""One job, start to end, wherever it runs (a Ray worker, or this process in a test).

The worker opens the store itself (the job row is the only channel back: any replica reads it),
marks the attempt running, beats every few seconds from a thread of its own, turns the planner's
progress notes into the row's progress and message, and ends the row done (with the result) or
failed (with the reason). A worker whose attempt was given up on finds the row moved on and stops
writing: the conditional updates in `job_store` refuse it.
"""

from __future__ import annotations

import threading
import traceback
from typing import Any

from api.job_store import JobStore
from api.plan_job import plan_job
from api.planning import store_answer
from api.store import PlanStore
from planner.plan.model import Plan
from planner.progress import reporting
from planner.targets import tpu_topology
from planner.wire import PlanRequest

VERIFY = "verify"
SEARCH = "search"
KINDS = (VERIFY, SEARCH)


def expected_notes(request: PlanRequest) -> int:
    """How many progress notes a verify job makes: planning, verifying, and each compile (three per
    compiler: the step as given, inlined and patched; XLA:TPU's too for a TPU chip with libtpu)."""
    from planner.plan.compilers.verify import libtpu_installed

    compilers = 1
    chip = request.chip or "cpu"
    if chip != "cpu" and libtpu_installed():
        mesh = request.mesh.to_mesh() if request.mesh is not None else None
        if mesh is not None and tpu_topology(chip, mesh.num_devices) is not None:
            compilers = 2
    return 2 + 3 * compilers


def verifying(request: PlanRequest) -> PlanRequest:
    """The request with verify on: what a verify job plans, and the key its plan is stored under."""
    return request.model_copy(update={"options": request.options.model_copy(update={"verify": True})})


def run_job(db_url: str, job_id: str, attempt: int, heartbeat_seconds: float) -> str:
    """Runs attempt `attempt` of the job; its final state (or `superseded` when the row moved on)."""
    store = PlanStore(db_url)
    jobs = JobStore(store)
    try:
        if not jobs.start(job_id, attempt):
            return "superseded"
        job = jobs.get(job_id)
        assert job is not None
        stop = threading.Event()
        beat = threading.Thread(target=_beat, args=(jobs, job_id, attempt, heartbeat_seconds, stop), daemon=True)
        beat.start()
        try:
            result, error = _work(store, jobs, job_id, attempt, job.kind, job.request)
        except Exception as e:
            result, error = None, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
        finally:
            stop.set()
            beat.join()
        if error is not None:
            return "failed" if jobs.fail(job_id, attempt, error) else "superseded"
        assert result is not None
        return "done" if jobs.finish(job_id, attempt, result) else "superseded"
    finally:
        store.close()


def _beat(jobs: JobStore, job_id: str, attempt: int, seconds: float, stop: threading.Event) -> None:
    while not stop.wait(seconds):
        if not jobs.beat(job_id, attempt):
            return


def _work(
    store: PlanStore, jobs: JobStore, job_id: str, attempt: int, kind: str, request: dict[str, Any]
) -> tuple[dict[str, Any] | None, str | None]:
    if kind == SEARCH:
        return _search(store, jobs, job_id, attempt, request)
    if kind != VERIFY:
        return None, f"no job kind {kind!r} (known: {', '.join(KINDS)})"
    plan_request = verifying(PlanRequest.model_validate(request))
    total = expected_notes(plan_request)
    seen = 0

    def progress(message: str) -> None:
        nonlocal seen
        # Each note starts a stage: the bar shows the stages finished, never reaching 1 before the end.
        jobs.report(job_id, attempt, min(seen / total, 0.99), message)
        seen += 1

    with reporting(progress):
        answer = plan_job(plan_request.job())
    if "status" in answer:
        where = f" (line {answer['line']}, column {answer['column']})" if answer.get("line") else ""
        return None, f"{answer['message']}{where}"
    plan_id = plan_request.content_hash()
    store_answer(store, plan_id, answer)
    # A plan whose compiles did not run is still the job's result; the record says so and why (`JobRecord`).
    not_run = Plan.model_validate_json(answer["plan_json"]).verify_not_run
    if not_run is not None:
        return {"plan_id": plan_id, "verify_not_run": not_run.model_dump(mode="json")}, None
    return {"plan_id": plan_id}, None


def _search(
    store: PlanStore, jobs: JobStore, job_id: str, attempt: int, spec: dict[str, Any]
) -> tuple[dict[str, Any] | None, str | None]:
    """A configuration search (`spmd-planner search`), its candidates as Ray tasks of their own (this task
    runs inside Ray); the ranking is stored as a search. Progress: candidates planned, then compiled."""
    from planner.search.candidates import candidate_grid, remat_policies
    from planner.search.evaluate import load_builder
    from planner.search.ranking import report_body, search
    from planner.wire import SearchSpec

    given = SearchSpec.model_validate(spec)
    candidates = candidate_grid(given.devices, given.axes, remat_policies(given.remat), given.microbatches,
                                given.chips)  # fmt: skip
    total = len(candidates) + given.top
    planned = 0

    def progress(what: str, done: int, of: int) -> None:
        nonlocal planned
        if what == "planned":
            planned = done
            finished = done
        else:
            finished = planned + done * given.top // max(of, 1)
        jobs.report(job_id, attempt, min(finished / total, 0.99), f"{what} {done} of {of} candidates")

    jobs.report(job_id, attempt, 0.0, f"planning {len(candidates)} candidates")
    report = search(load_builder(given.builder), candidates, top_k=given.top, progress=progress)
    body = report_body(report, given.builder)
    search_id = body.content_hash()
    store.put_search(search_id, body.model_dump_json())
    return {"search_id": search_id}, None

"""Jobs: recorded in the store, run on Ray, watched as they go, and never left running by a worker that died."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from conftest import CORPUS, REPO
from fastapi.testclient import TestClient

from api import create_app
from api.job_runner import run_job
from api.job_store import JobStore
from api.jobs import JobQueue
from api.settings import Settings
from api.store import PlanStore

SMALL = (CORPUS / "torch_xla" / "llama_scan_L4_small.hlo").read_text()
MESH = {"shape": [4, 2], "axis_names": ["fsdp", "tp"]}
VERIFY = {"kind": "verify", "request": {"hlo": SMALL, "mesh": MESH}}


class RecordingQueue(JobQueue):
    """The service's queue with dispatch recorded instead of sent to Ray."""

    def __init__(self, jobs: JobStore, settings: Settings) -> None:
        super().__init__(jobs, settings)
        self.sent: list[tuple[str, int]] = []

    def dispatch(self, job) -> None:  # type: ignore[no-untyped-def]
        self.sent.append((job.id, job.attempt))

    def check(self):  # type: ignore[no-untyped-def]
        """`check`, once the jobs it sends have been sent (that happens on the queue's own thread)."""
        done = super().check()
        self._sender.submit(lambda: None).result()
        return done


def test_a_verify_job_runs_to_done_with_its_stages_as_progress(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path / 'plans.sqlite3'}"
    store = PlanStore(store_url)
    jobs = JobStore(store)
    job = jobs.create("verify", VERIFY["request"], "anonymous", "gone")
    seen: list[tuple[float, str]] = []
    original = jobs.report

    def report(job_id: str, attempt: int, progress: float, message: str) -> bool:
        seen.append((progress, message))
        return original(job_id, attempt, progress, message)

    jobs.report = report  # type: ignore[method-assign]
    import api.job_runner as runner

    real_store = runner.JobStore
    runner.JobStore = lambda _: jobs  # type: ignore[assignment,misc]
    try:
        assert run_job(store_url, job.id, 1, heartbeat_seconds=0.2) == "done"
    finally:
        runner.JobStore = real_store  # type: ignore[misc]
    done = jobs.get(job.id)
    assert done is not None and done.state == "done" and done.progress == 1.0 and done.error is None
    # Planning, verifying, then XLA:CPU compiling the step as given, inlined and patched, in that order.
    messages = [m for _, m in seen]
    assert messages[0].startswith("planning") and messages[1].startswith("verifying")
    assert messages[2:] == ["XLA:CPU: compiling the step as given", "XLA:CPU: compiling the inlined step",
                            "XLA:CPU: compiling the patched step"]  # fmt: skip
    assert [p for p, _ in seen] == sorted(p for p, _ in seen) and all(p < 1 for p, _ in seen)
    stored = store.get(done.result["plan_id"])  # type: ignore[index]
    assert stored is not None and json.loads(stored.plan_json)["verification"]["xla"]
    # A second worker for the same attempt finds the job already ended: it writes nothing.
    assert run_job(store_url, job.id, 1, heartbeat_seconds=0.2) == "superseded"
    store.close()


def test_a_job_whose_worker_stopped_is_retried_then_failed_with_the_reason(store_url: str) -> None:
    settings = Settings(db=store_url, job_stale_seconds=0.3, job_attempts=2)
    store = PlanStore(store_url)
    jobs = JobStore(store)
    queue = RecordingQueue(jobs, settings)
    job = jobs.create("verify", VERIFY["request"], "anonymous", "gone")
    assert jobs.start(job.id, 1)  # a worker took attempt 1, then died without a word
    time.sleep(0.4)
    assert [(j.id, action) for j, action in queue.check()] == [(job.id, "retried")]
    assert queue.sent == [(job.id, 2)] and jobs.get(job.id).state == "queued"  # type: ignore[union-attr]
    # The dead worker's attempt can no longer write; the new one can.
    assert not jobs.report(job.id, 1, 0.5, "late news") and jobs.start(job.id, 2)
    time.sleep(0.4)
    assert [action for _, action in queue.check()] == ["failed"]
    failed = jobs.get(job.id)
    assert failed is not None and failed.state == "failed" and failed.attempt == 2
    assert "the worker running attempt 2 stopped (no heartbeat for 0.3 s); 2 attempts made, none finished" in (
        failed.error or ""
    )
    assert queue.check() == []  # nothing left running
    # A job sent by a replica that still beats for it waits as long as it must; one whose replica
    # stopped (its local Ray, and the job in Ray's queue, gone with it) is sent again.
    waiting = jobs.create("verify", VERIFY["request"], "anonymous", queue.replica)
    orphan = jobs.create("verify", VERIFY["request"], "anonymous", "gone")
    time.sleep(0.4)
    jobs.beat_queued(queue.replica)
    assert [(j.id, action) for j, action in queue.check()] == [(orphan.id, "retried")]
    retried = jobs.get(orphan.id)
    assert retried is not None and retried.replica == queue.replica and retried.attempt == 2
    assert "the replica that sent attempt 1 stopped before a worker started it" in retried.message
    assert jobs.get(waiting.id).attempt == 1  # type: ignore[union-attr]
    store.close()


def test_post_jobs_answers_202_at_once_and_the_event_stream_ends_with_the_result(tmp_path: Path) -> None:
    """On a replica with its own local Ray: a new job runs to its end, watched as events; and a job an
    earlier replica left running (its worker died with it) is picked up when this one starts."""
    db = f"sqlite:///{tmp_path / 'plans.sqlite3'}"
    store = PlanStore(db)
    jobs = JobStore(store)
    left = jobs.create("verify", {**VERIFY["request"], "hbm_bytes": 1 << 40}, "token:earlier", "gone")
    jobs.start(left.id, 1)
    jobs._write(left.id, 1, ("running",), heartbeat_at=time.time() - 60)  # its last beat, a minute ago
    settings = Settings(db=db, jobs_per_token=1, job_stale_seconds=5, job_check_seconds=0.5)
    with TestClient(create_app(settings)) as c:
        started = time.perf_counter()
        answer = c.post("/jobs", json=VERIFY)
        assert answer.status_code == 202 and time.perf_counter() - started < 30
        record = answer.json()
        assert answer.headers["location"] == f"/jobs/{record['id']}" and record["state"] in ("queued", "running")
        # One job at a time for this caller: a second is refused until the first ends.
        second = c.post("/jobs", json=VERIFY)
        assert second.status_code == 429 and "quota" in second.json()["detail"]
        events: list[tuple[str, dict]] = []
        with c.stream("GET", record["links"]["events"]) as stream:
            kind = None
            for line in stream.iter_lines():
                if line.startswith("event: "):
                    kind = line.removeprefix("event: ")
                elif line.startswith("data: "):
                    events.append((kind or "", json.loads(line.removeprefix("data: "))))
        assert events[-1][0] == "end" and events[-1][1]["state"] == "done"
        assert all(k == "progress" for k, _ in events[:-1])
        progress = [e["progress"] for _, e in events]
        assert progress == sorted(progress) and progress[-1] == 1.0
        done = c.get(f"/jobs/{record['id']}").json()
        assert done["result"]["plan_id"] and c.get(done["links"]["plan"]).status_code == 200
        page = c.get(done["links"]["view"]).text
        assert 'id="bar"' in page and 'id="plan"' in page and "done" in page
        assert c.get("/jobs").json()["items"][0]["id"] == record["id"]
        assert c.post("/jobs", json=VERIFY).status_code == 202  # the quota frees when the job ends
        assert c.get("/jobs/nothing").status_code == 404
        picked_up = _until_finished(c, left.id, timeout=240)
        assert picked_up["state"] == "done" and picked_up["attempt"] == 2, picked_up
        assert c.get(picked_up["links"]["plan"]).json()["plan"]["verification"]["xla"]
    store.close()


def test_rate_limit_per_token_is_429_with_retry_after(tmp_path: Path) -> None:
    c = TestClient(create_app(Settings(db=f"sqlite:///{tmp_path / 'p.sqlite3'}", requests_per_minute=2)))
    bad = {"hlo": "HloModule m\n"}
    assert [c.post("/plan", json=bad).status_code for _ in range(2)] == [422, 422]
    third = c.post("/plan", json=bad)
    assert third.status_code == 429 and 1 <= int(third.headers["retry-after"]) <= 30
    assert "2 requests a minute per token" in third.json()["detail"]
    # Reading is not limited.
    assert c.get("/plans").status_code == 200


def test_readiness_follows_the_lifespan(tmp_path: Path) -> None:
    app = create_app(Settings(db=f"sqlite:///{tmp_path / 'p.sqlite3'}"))
    assert TestClient(app).get("/readyz").status_code == 503  # not started
    with TestClient(app) as c:
        ready = c.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "ok"
    assert TestClient(app).get("/readyz").json()["status"] == "starting or stopping"


def _until_finished(c: TestClient, job_id: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = c.get(f"/jobs/{job_id}").json()
        if record["state"] in ("done", "failed"):
            return record  # type: ignore[no-any-return]
        time.sleep(0.5)
    pytest.fail(f"job {job_id} still {record['state']} after {timeout} s: {record['message']}")


def test_a_search_job_ranks_on_ray_and_stores_the_ranking(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A search job runs `spmd-planner search`'s work inside Ray (its candidates as tasks of their own); only
    builders the operator names may run."""
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    settings = Settings(db=f"sqlite:///{tmp_path / 'p.sqlite3'}", search_builders=["search_llama_jax:build"])
    spec = {"builder": "search_llama_jax:build", "devices": 8, "remat": ["none"], "chips": ["v6e"], "top": 1}
    with TestClient(create_app(settings)) as c:
        refused = c.post("/jobs", json={"kind": "search", "search": {**spec, "builder": "os:system"}})
        assert refused.status_code == 422 and "not one this service runs: search_llama_jax:build" in refused.text
        assert c.post("/jobs", json={"kind": "search"}).status_code == 422  # no grid
        record = c.post("/jobs", json={"kind": "search", "search": spec}).json()
        done = _until_finished(c, record["id"], timeout=600)
        assert done["state"] == "done", done
        ranking = c.get(done["links"]["search"]).json()["report"]
        rows = ranking["rows"]
        # fsdp x tp over 8 chips: four meshes, all planned; the best one compiled by the chip's compiler.
        assert ranking["builder"] == "search_llama_jax:build" and len(rows) == 4
        assert rows[0]["compiled_bytes"] and not any(r["compiled_bytes"] for r in rows[1:])
        assert 'id="search"' in c.get(done["links"]["view"]).text


def test_the_dashboard_form_s_verify_button_starts_a_job_and_shows_its_page(tmp_path: Path) -> None:
    settings = Settings(db=f"sqlite:///{tmp_path / 'plans.sqlite3'}", jobs_per_token=1)
    app = create_app(settings)
    with TestClient(app) as c:
        queue = RecordingQueue(app.state.jobs.jobs, settings)
        app.state.jobs = queue
        form = {"hlo": SMALL, "mesh": "fsdp=4,tp=2", "chip": "v6e", "action": "verify"}
        answer = c.post("/", data=form, follow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"].startswith("/jobs/")
        job_id = answer.headers["location"].removeprefix("/jobs/").removesuffix("/view")
        record = c.get(f"/jobs/{job_id}").json()
        assert record["kind"] == "verify" and record["state"] in ("queued", "running")
        assert queue.sent and queue.sent[0][0] == job_id
        assert 'id="bar"' in c.get(answer.headers["location"]).text
        # The jobs page lists it, linking its page; every page's header links the jobs page.
        listed = c.get("/recent-jobs").text
        assert f'href="/jobs/{job_id}/view"' in listed and "verify" in listed
        assert 'href="/recent-jobs"' in c.get("/").text
        # The quota holds for the form as for POST /jobs.
        again = c.post("/", data=form, follow_redirects=False)
        assert again.status_code == 429 and "quota" in again.text
    with TestClient(create_app(Settings(db=f"sqlite:///{tmp_path / 'other.sqlite3'}"))) as c:
        # HLO that does not parse is refused at once, the form back with the message.
        bad = c.post("/", data={**form, "hlo": "HloModule m\n\nENTRY e {\n  ROOT a = f32[4] add(p, q)\n}\n"})
        assert bad.status_code == 422 and "4:23: operand &#39;p&#39; of &#39;a&#39; is not defined" in bad.text


def test_a_plan_page_verifies_its_step_as_a_job_from_the_same_file(tmp_path: Path) -> None:
    settings = Settings(db=f"sqlite:///{tmp_path / 'plans.sqlite3'}")
    app = create_app(settings)
    with TestClient(app) as c:
        queue = RecordingQueue(app.state.jobs.jobs, settings)
        app.state.jobs = queue
        record = c.post("/plan", json={"hlo": SMALL, "mesh": MESH, "hbm_bytes": 3 << 30}).json()
        page = c.get(f"/plans/{record['id']}/view").text
        form = page.split('<form class="verify"')[1].split("</form>")[0]
        fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', form))
        assert fields == {"action": "verify", "mesh": "fsdp=4,tp=2", "chip": f"{3 << 30}B"}
        answer = c.post("/", data=fields, files={"hlo_file": ("step.hlo", SMALL)}, follow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"].endswith("/view")
        job = c.get(answer.headers["location"].removesuffix("/view")).json()
        assert job["kind"] == "verify" and queue.sent[0][0] == job["id"]
        # The job plans what the page planned: the same module, mesh and capacity.
        asked = queue.jobs.get(job["id"]).request  # type: ignore[union-attr]
        assert asked["hlo"] == SMALL and asked["mesh"] == {**MESH, "device_ids": None}
        assert asked["hbm_bytes"] == 3 << 30

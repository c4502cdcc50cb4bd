"""Two replicas on one PostgreSQL under load, one of them killed mid-run.

    .venv/bin/python bench/load.py [--clients 16] [--requests 200] [--jobs 8] [--kill-at 0.33]

Starts a PostgreSQL server (Debian's package, as the tests do) and two `spmd-planner serve` replicas
on loopback sharing it, each with its own local Ray for jobs. Every client sends `--requests`
requests, spread over both replicas: plans (a few distinct requests, so most are answered from the
store, some computed by two replicas at once), reads of stored plans and of the plan list, and verify
jobs whose progress it polls. Once `--kill-at` of all requests are sent, one replica is killed
(SIGKILL, with its planner processes and its Ray); clients whose replica is gone send to the other.
Then every job is waited for. Printed: answers by status, p50/p99 latency per kind, plans stored
against distinct plans asked (lost or duplicated plans), every job's end state and reason. Exit 1 on
any 5xx, lost or duplicated plan, or job not ended done or failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from postgres_server import PostgresServer, _free_port  # noqa: E402

SHARED = Path(os.environ.get("SPMD_SHARED_DIR", REPO.parent / "shared"))
SMALL = SHARED / "corpus" / "torch_xla" / "llama_scan_L4_small.hlo"
MESH = {"shape": [4, 2], "axis_names": ["fsdp", "tp"]}
GIB = 1 << 30


@dataclass
class Replica:
    url: str
    process: subprocess.Popen[str]
    alive: bool = True


@dataclass
class Tally:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)
    failovers: int = 0
    plan_ids: dict[str, set[str]] = field(default_factory=dict)  # request key -> ids answered
    jobs: list[str] = field(default_factory=list)
    job_replica: dict[str, int] = field(default_factory=dict)  # job -> the replica it was posted to
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, kind: str, status: int, seconds: float) -> None:
        with self.lock:
            self.latencies.setdefault(kind, []).append(seconds)
            self.statuses[status] = self.statuses.get(status, 0) + 1


def start_replica(db_url: str, log: Path) -> Replica:
    port = _free_port()
    env = dict(os.environ, SPMD_PLANNER_JOBS_PER_TOKEN="1000", SPMD_PLANNER_REQUESTS_PER_MINUTE="1000000",
               SPMD_PLANNER_JOB_STALE_SECONDS="10", SPMD_PLANNER_JOB_CHECK_SECONDS="2",
               SPMD_PLANNER_MAX_WORKERS="1")  # fmt: skip
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "spmd-planner"), "serve", "--host", "127.0.0.1", "--port", str(port),
             "--db", db_url], stdout=out, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
                if r.status == 200:
                    return Replica(url, process)
        except OSError:
            if process.poll() is not None:
                break
        time.sleep(0.2)
    raise RuntimeError(f"replica did not become ready: {log.read_text()[-2000:]}")


def call(replicas: list[Replica], turn: int, method: str, path: str, body: dict | None, tally: Tally,
         kind: str) -> tuple[int, dict | None]:  # fmt: skip
    """One request to the replica whose turn it is; a replica that is gone hands it to the next one."""
    for k in range(len(replicas)):
        replica = replicas[(turn + k) % len(replicas)]
        if not replica.alive:
            continue
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(replica.url + path, data, {"Content-Type": "application/json"},
                                         method=method)  # fmt: skip
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=300) as r:
                status, payload = r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            status, payload = e.code, None
        except OSError:
            with tally.lock:
                tally.failovers += 1
            continue  # connection refused or reset: that replica is down
        tally.record(kind, status, time.perf_counter() - start)
        if kind == "POST /jobs" and status == 202 and payload:
            with tally.lock:
                tally.jobs.append(payload["id"])
                tally.job_replica[payload["id"]] = (turn + k) % len(replicas)
        return status, payload
    raise RuntimeError("no replica answers")


def client(index: int, replicas: list[Replica], requests: int, job_at: int | None, tally: Tally,
           sent: list[int], hlo: str, think: float) -> None:  # fmt: skip
    known: list[str] = []
    my_job: str | None = None
    for i in range(requests):
        time.sleep(think)
        with tally.lock:
            sent[0] += 1
        turn = index + i
        try:
            if job_at is not None and i == job_at:
                body = {"kind": "verify", "request": {"hlo": hlo, "mesh": MESH, "hbm_bytes": (40 + index) * GIB}}
                status, payload = call(replicas, turn, "POST", "/jobs", body, tally, "POST /jobs")
                if status == 202 and payload:
                    my_job = payload["id"]
            elif i % 10 < 5:
                variant = (index + i) % 6
                body = {"hlo": hlo, "mesh": MESH, "hbm_bytes": (16 + variant) * GIB}
                status, payload = call(replicas, turn, "POST", "/plan", body, tally, "POST /plan")
                if status == 200 and payload:
                    known.append(payload["id"])
                    with tally.lock:
                        tally.plan_ids.setdefault(str(variant), set()).add(payload["id"])
            elif i % 10 < 8 and known:
                call(replicas, turn, "GET", f"/plans/{known[-1]}", None, tally, "GET /plans/{id}")
            elif i % 10 == 8 and my_job:
                call(replicas, turn, "GET", f"/jobs/{my_job}", None, tally, "GET /jobs/{id}")
            else:
                call(replicas, turn, "GET", "/plans?limit=20", None, tally, "GET /plans")
        except RuntimeError as e:
            with tally.lock:
                tally.errors.append(str(e))


@dataclass
class LoadReport:
    statuses: dict[int, int]
    server_errors: int
    latencies: dict[str, tuple[int, float, float]]  # kind -> (count, p50 s, p99 s)
    failovers: int
    distinct_plans: int
    stored_plans: int
    answered_not_stored: int
    duplicated: int
    jobs: dict[str, tuple[str, int, str]]  # id -> (state, attempt, error)
    killed_after: int
    seconds: float
    client_errors: list[str]

    @property
    def ok(self) -> bool:
        ended = all(state in ("done", "failed") for state, _, _ in self.jobs.values())
        return (self.server_errors == 0 and self.answered_not_stored == 0 and self.duplicated == 0 and ended
                and not self.client_errors)  # fmt: skip


def run_load(
    clients: int,
    requests: int,
    jobs: int,
    kill_at: float,
    work: Path,
    kill_a_running_job: bool = False,
    think: float = 0.0,
) -> LoadReport:
    """The load run (see the module's docstring); with `kill_a_running_job`, the kill also waits (two
    minutes at most) until a job posted to the replica it kills is running there. Each client waits
    `think` seconds before each request."""
    import psycopg

    hlo = SMALL.read_text()
    # Its own directory under the system's temporary one: the server may run as another user.
    pg_root = Path(tempfile.mkdtemp(prefix="spmd-planner-postgres-"))
    server = PostgresServer(pg_root).start()
    replicas: list[Replica] = []
    try:
        db_url = server.new_database()
        replicas = [start_replica(db_url, work / f"replica{k}.log") for k in range(2)]
        tally = Tally()
        sent = [0]
        total = clients * requests
        job_clients = set(range(0, clients, max(1, clients // max(jobs, 1)))) if jobs else set()
        job_clients = set(sorted(job_clients)[:jobs])
        threads = [threading.Thread(target=client, args=(c, replicas, requests, (requests // 10) if c in job_clients
                                    else None, tally, sent, hlo, think)) for c in range(clients)]  # fmt: skip
        start = time.perf_counter()
        for t in threads:
            t.start()
        while sent[0] < kill_at * total and any(t.is_alive() for t in threads):
            time.sleep(0.05)
        deadline = time.monotonic() + 120
        while kill_a_running_job and time.monotonic() < deadline and not _running_on(replicas, tally, 0):
            time.sleep(0.2)
        killed_after = sent[0]
        victim = replicas[0]
        victim.alive = False
        os.killpg(victim.process.pid, signal.SIGKILL)
        for t in threads:
            t.join()
        # Every job must end, done or failed with its reason: one that ran on the killed replica's Ray is
        # retried by the other replica once its heartbeat is stale.
        finished: dict[str, tuple[str, int, str]] = {}
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and len(finished) < len(tally.jobs):
            for job_id in tally.jobs:
                if job_id in finished:
                    continue
                with urllib.request.urlopen(f"{replicas[1].url}/jobs/{job_id}", timeout=30) as r:
                    record = json.loads(r.read())
                if record["state"] in ("done", "failed"):
                    finished[job_id] = (record["state"], record["attempt"], ((record["error"] or "").splitlines()[0:1]
                                        and record["error"].splitlines()[0]) or "")  # fmt: skip
            time.sleep(1)
        for job_id in tally.jobs:
            if job_id not in finished:
                with urllib.request.urlopen(f"{replicas[1].url}/jobs/{job_id}", timeout=30) as r:
                    record = json.loads(r.read())
                finished[job_id] = (record["state"], record["attempt"], record["message"])
        seconds = time.perf_counter() - start
        answered = set().union(*tally.plan_ids.values()) if tally.plan_ids else set()
        with psycopg.connect(db_url.replace("postgresql://", "postgresql://", 1)) as db:
            stored_ids = {row[0] for row in db.execute("SELECT id FROM plans")}
            rows = db.execute("SELECT COUNT(*) FROM plans").fetchone()
        stored = int(rows[0]) if rows else 0
        duplicated = sum(1 for ids in tally.plan_ids.values() if len(ids) > 1) + (stored - len(stored_ids))
        latencies = {kind: (len(v), statistics.median(v), sorted(v)[min(len(v) - 1, int(0.99 * len(v)))])
                     for kind, v in sorted(tally.latencies.items())}  # fmt: skip
        return LoadReport(dict(sorted(tally.statuses.items())), sum(n for s, n in tally.statuses.items() if s >= 500),
                          latencies, tally.failovers, len(tally.plan_ids), stored, len(answered - stored_ids),
                          duplicated, finished, killed_after, seconds, tally.errors)  # fmt: skip
    finally:
        for r in replicas:
            if r.process.poll() is None:
                os.killpg(r.process.pid, signal.SIGTERM)
                try:
                    r.process.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(r.process.pid, signal.SIGKILL)
        server.stop()
        shutil.rmtree(pg_root, ignore_errors=True)


def _running_on(replicas: list[Replica], tally: Tally, index: int) -> bool:
    """Whether a job posted to replica `index` is running now (asked of the other replica)."""
    with tally.lock:
        mine = [j for j, r in tally.job_replica.items() if r == index]
    for job_id in mine:
        with urllib.request.urlopen(f"{replicas[1 - index].url}/jobs/{job_id}", timeout=30) as r:
            if json.loads(r.read())["state"] == "running":
                return True
    return False


def print_report(report: LoadReport, clients: int, requests: int) -> None:
    print(f"{clients} clients x {requests} requests on 2 replicas sharing one PostgreSQL; replica 0 killed after "
          f"{report.killed_after:,} requests; {report.seconds:.1f} s in all")  # fmt: skip
    print(f"answers by status: {report.statuses}   5xx: {report.server_errors}   "
          f"requests moved to the other replica: {report.failovers}")  # fmt: skip
    print(f"{'request':<18} {'count':>6} {'p50 ms':>9} {'p99 ms':>9}")
    for kind, (count, p50, p99) in report.latencies.items():
        print(f"{kind:<18} {count:>6} {p50 * 1000:>9.1f} {p99 * 1000:>9.1f}")
    done_jobs = sum(1 for state, _, _ in report.jobs.values() if state == "done")
    print(f"plans: {report.distinct_plans} distinct asked, {report.stored_plans} stored (with the {done_jobs} "
          f"verify jobs' plans), {report.answered_not_stored} answered but not stored (lost), "
          f"{report.duplicated} duplicated")  # fmt: skip
    states: dict[str, int] = {}
    for state, _, _ in report.jobs.values():
        states[state] = states.get(state, 0) + 1
    print(f"jobs: {len(report.jobs)} ({states}); retried: {sum(1 for _, a, _ in report.jobs.values() if a > 1)}")
    for job_id, (state, attempt, why) in report.jobs.items():
        if state != "done" or attempt > 1:
            print(f"  {job_id} {state} attempt {attempt}: {why}")
    for error in report.client_errors:
        print(f"  client error: {error}")
    print("verdict: " + ("ok" if report.ok else "FAILED"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--kill-at", type=float, default=0.33)
    args = ap.parse_args()
    # A stopped benchmark still stops its servers (the `finally` in run_load).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="spmd-planner-load-") as work:
        report = run_load(args.clients, args.requests, args.jobs, args.kill_at, Path(work))
    print_report(report, args.clients, args.requests)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())

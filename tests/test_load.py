"""Load: the real server under 16 concurrent clients, mixed cached, uncached and invalid requests.

Bounded: 240 requests on loopback, each with a timeout. Asserts every valid request planned (no 5xx,
no time-limit answer), every invalid one a located 422, every answered plan stored and readable (none
lost), `/healthz` answering throughout, and identical requests in flight at once planned once. The
run's numbers (wall time, slowest /healthz) are printed, not asserted.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from conftest import CORPUS, xla_cases
from live_server import live_server

CLIENTS = 16
CACHED = 160
INVALID = 40


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}/plan", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_sixteen_clients_mixed_requests(tmp_path: Path) -> None:
    small = (CORPUS / "torch_xla" / "llama_scan_L4_small.hlo").read_text()
    mesh = {"shape": [4, 2], "axis_names": ["fsdp", "tp"]}
    uncached = [{"hlo": case["hlo"]} for case in xla_cases()[:40]]
    cached = [{"hlo": small, "mesh": mesh}] * CACHED
    invalid = [{"hlo": case["hlo"].replace("ROOT", "ROOT ROOT", 1)} for case in xla_cases()[:INVALID]]
    requests = [r for group in zip(uncached, cached[:40], invalid) for r in group] + cached[40:]
    assert len(requests) >= 200

    health: list[float] = []
    stop = threading.Event()
    with live_server(tmp_path / "plans.sqlite3") as url:
        # Identical requests at once: one plan computed, the others answered with it.
        with ThreadPoolExecutor(CLIENTS) as pool:
            same = list(pool.map(lambda _: post(url, {"hlo": small, "mesh": mesh}), range(CLIENTS)))
        assert [status for status, _ in same] == [200] * CLIENTS
        assert len({body["id"] for _, body in same}) == 1
        assert sum(not body["cached"] for _, body in same) == 1

        def watch() -> None:
            while not stop.is_set():
                start = time.monotonic()
                with urllib.request.urlopen(f"{url}/healthz", timeout=10) as r:
                    assert r.status == 200
                health.append(time.monotonic() - start)
                stop.wait(0.25)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        started = time.monotonic()
        with ThreadPoolExecutor(CLIENTS) as pool:
            answers = list(pool.map(lambda body: post(url, body), requests))
        elapsed = time.monotonic() - started
        stop.set()
        watcher.join(15)

        statuses = [status for status, _ in answers]
        assert statuses.count(422) == INVALID and statuses.count(200) == len(requests) - INVALID, sorted(set(statuses))
        assert all("line" in body and body["line"] for status, body in answers if status == 422)
        planned = {body["id"] for status, body in answers if status == 200}
        # No lost plans: every answered plan is stored, and the store has nothing else.
        for plan_id in planned:
            with urllib.request.urlopen(f"{url}/plans/{plan_id}", timeout=10) as r:
                assert json.loads(r.read())["id"] == plan_id
        with urllib.request.urlopen(f"{url}/plans?limit=500", timeout=10) as r:
            assert {item["id"] for item in json.loads(r.read())["items"]} == planned
    counts = {status: statuses.count(status) for status in sorted(set(statuses))}
    print(
        f"load: {len(requests)} requests from {CLIENTS} clients in {elapsed:.1f} s, statuses {counts}, "
        f"{len(planned)} plans stored, /healthz {len(health)} polls, slowest {max(health) * 1000:.0f} ms"
    )
    assert len(health) >= 3

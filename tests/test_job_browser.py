"""A verify job of the 405B-shaped step on the real server: run on Ray, its progress watched in Chromium."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO
from headless import chromium
from live_server import live_server

OUTPUT = REPO / "test-output" / "dashboard"
LLAMA_405B = REPO / "tests" / "fixtures" / "generated" / "jax_llama405b_remat_L126_fsdp64_tp4.hlo"


@pytest.mark.browser
def test_a_405b_verify_job_shows_its_progress_then_its_plan_in_chromium(tmp_path: Path) -> None:
    body = {"kind": "verify", "request": {"hlo": LLAMA_405B.read_text(), "hbm_bytes": 95 << 30,
                                          "mesh": {"shape": [64, 4], "axis_names": ["fsdp", "tp"]}}}  # fmt: skip
    with live_server(tmp_path / "plans.sqlite3") as server:
        request = urllib.request.Request(f"{server}/jobs", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=60) as r:
            assert r.status == 202
            job = json.loads(r.read())
        seen: list[tuple[float, str, str]] = []
        ticks: list[tuple[int, str | None]] = []  # the page's elapsed seconds, and what it says runs now
        with chromium() as browser, browser.page(f"{server}{job['links']['view']}", 1200, 700) as page:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                state, value, message = page.evaluate(
                    "[document.getElementById('state').textContent, document.getElementById('bar').value,"
                    " document.getElementById('message').textContent]"
                )
                if not seen or seen[-1] != (value, message, state):
                    seen.append((value, message, state))
                    if 0 < value < 1 and len([s for s in seen if 0 < s[0] < 1]) == 2:
                        OUTPUT.mkdir(parents=True, exist_ok=True)
                        page.screenshot(OUTPUT / "job_running.png")
                clock = page.evaluate("document.getElementById('elapsed').textContent")
                if state not in ("done", "failed"):
                    ticks.append((int(clock.removesuffix(" s")), page.evaluate(
                        "(document.getElementById('now') || {}).textContent || null")))  # fmt: skip
                if state in ("done", "failed"):
                    break
                time.sleep(0.1)
            page.screenshot(OUTPUT / "job_done.png")
            link = page.evaluate("document.getElementById('plan') && document.getElementById('plan').href")
    assert seen[-1][2] == "done", seen
    # The bar moved while the page was open: the page followed the job's stages as they came (server-sent
    # events), through the compiles, to the end.
    running = [s for s in seen if 0 < s[0] < 1]
    assert len(running) >= 2 and [s[0] for s in seen] == sorted(s[0] for s in seen), seen
    assert any(m.startswith("XLA:CPU: compiling") for _, m, _ in running), seen
    assert seen[-1][0] == 1 and link and link.endswith("/view"), (seen, link)
    # The elapsed time counted up while the job ran, beside the stage running then.
    assert ticks[-1][0] - ticks[0][0] >= 10 and [t for t, _ in ticks] == sorted(t for t, _ in ticks), ticks[::50]
    assert any(now is not None and now.startswith("XLA:CPU: compiling") for _, now in ticks)

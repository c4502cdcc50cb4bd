"""End to end: the real server on loopback, a real plan, the page in real headless Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator

import pytest
from conftest import REPO
from live_server import live_server

from planner.data import DEFAULT_DUMP

OUTPUT = REPO / "test-output" / "dashboard"
# Chromium as root in a sandbox, with nothing that phones home (this machine has no network).
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
]  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with live_server(tmp_path_factory.mktemp("server") / "plans.sqlite3") as url:
        yield url


def post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium")
    assert binary, "Debian's chromium is not installed (make test installs it)"
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.browser
def test_plan_page_renders_in_chromium(server: str) -> None:
    record = post_json(f"{server}/plan", {
        "hlo": DEFAULT_DUMP.read_text(), "mesh": {"shape": [4, 2], "axis_names": ["fsdp", "tp"]}, "hbm_bytes": 600 << 20,
    })  # fmt: skip
    page = f"{server}/plans/{record['id']}/view"
    dom = chromium("--dump-dom", page)
    assert dom.returncode == 0, dom.stderr
    html = dom.stdout
    # The chart: a bar per chip before and after, and the capacity line the chips cross.
    assert html.count('class="before"') == 8 and html.count('class="after"') == 8
    assert 'class="capacity"' in html and "over capacity" in html
    # The findings, with the root cause's notation, and the placements.
    assert "stacked-gradient" in html and "while.2384[38]" in html
    assert "dot.1660[1024_tp, 4096]" in html
    assert 'id="placements"' in html and "recommended" in html

    OUTPUT.mkdir(parents=True, exist_ok=True)
    shot = OUTPUT / "plan.png"
    shot.unlink(missing_ok=True)
    taken = chromium(f"--screenshot={shot}", "--window-size=1280,2000", page)
    assert taken.returncode == 0, taken.stderr
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000

    index = chromium("--dump-dom", server)
    assert f"/plans/{record['id']}/view" in index.stdout

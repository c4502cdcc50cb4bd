"""End to end: the real server on loopback, a real plan, the page in real headless Chromium."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO
from headless import CHROMIUM_FLAGS, chromium, chromium_binary
from live_server import live_server

from planner.data import DEFAULT_DUMP

OUTPUT = REPO / "test-output" / "dashboard"
# A 256-chip step: Llama 3.1 405B's shapes on fsdp=64 x tp=4, lowered by JAX from abstract inputs
# (`python -m fidelity.generate`, case jax_llama405b_remat_L126_fsdp64_tp4).
LLAMA_405B = REPO / "tests" / "fixtures" / "generated" / "jax_llama405b_remat_L126_fsdp64_tp4.hlo"
WIDTH, VIEWPORT_HEIGHT = 1400, 900
MAX_PAGE_HEIGHT = 6000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with live_server(tmp_path_factory.mktemp("server") / "plans.sqlite3") as url:
        yield url


def post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def chromium_cli(*args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([chromium_binary(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.browser
def test_plan_page_renders_in_chromium(server: str) -> None:
    record = post_json(f"{server}/plan", {
        "hlo": DEFAULT_DUMP.read_text(), "mesh": {"shape": [4, 2], "axis_names": ["fsdp", "tp"]}, "hbm_bytes": 600 << 20,
    })  # fmt: skip
    page = f"{server}/plans/{record['id']}/view"
    dom = chromium_cli("--dump-dom", page)
    assert dom.returncode == 0, dom.stderr
    html = dom.stdout
    # The chart: a bar per chip before and after, and the capacity line the chips cross.
    assert html.count('<rect class="before"') == 8 and html.count('<rect class="after"') == 8
    assert 'class="capacity"' in html and "over capacity" in html
    # The findings, with the root cause's notation, and the placements.
    assert "stacked-gradient" in html and "while.2384[38]" in html
    assert "dot.1660[1024_tp, 4096]" in html
    assert 'id="placements"' in html and "recommended" in html

    OUTPUT.mkdir(parents=True, exist_ok=True)
    shot = OUTPUT / "plan.png"
    shot.unlink(missing_ok=True)
    taken = chromium_cli(f"--screenshot={shot}", "--window-size=1280,2000", page)
    assert taken.returncode == 0, taken.stderr
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000

    index = chromium_cli("--dump-dom", server)
    assert f"/plans/{record['id']}/view" in index.stdout


# What the page measures of itself once loaded: its size, and where the verdict and the charts are.
MEASURE = """(() => {
  const box = (e) => { if (!e) return null; const r = e.getBoundingClientRect();
                       return {top: r.top, bottom: r.bottom, left: r.left, right: r.right, width: r.width, height: r.height}; };
  return {
    height: document.documentElement.scrollHeight,
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: window.innerWidth, innerHeight: window.innerHeight,
    verdict: box(document.getElementById("verdict")),
    verdictText: (document.getElementById("verdict") || {}).innerText,
    mesh: box(document.querySelector("#mesh svg")),
    chipBars: document.querySelectorAll("#hbm-chart rect.after").length,
    timelines: document.querySelectorAll("#timeline polyline").length,
    peaks: document.querySelectorAll("#timeline circle.timeline-peak").length,
    widest: Math.max(...[...document.querySelectorAll("main *")].map((e) => e.getBoundingClientRect().right)),
    text: document.body.innerText,
  };
})()"""

SCALES = [
    pytest.param(DEFAULT_DUMP, {"shape": [4, 2], "axis_names": ["fsdp", "tp"]}, {"hbm_bytes": 600 << 20}, 8,
                 id="8_chips"),
    pytest.param(LLAMA_405B, {"shape": [64, 4], "axis_names": ["fsdp", "tp"]}, {"chip": "v5p"}, 256,
                 id="256_chips"),
]  # fmt: skip


@pytest.mark.browser
@pytest.mark.parametrize("hlo,mesh,capacity,num_chips", SCALES)
def test_plan_page_is_one_screen_wide_verdict_first(
    server: str, hlo: Path, mesh: dict, capacity: dict, num_chips: int
) -> None:
    record = post_json(f"{server}/plan", {"hlo": hlo.read_text(), "mesh": mesh, **capacity})
    plan = record["plan"]
    # Bytes per chip come grouped by value, each value's chips as id ranges.
    groups = plan["hbm"]["per_chip_before"]
    assert (
        plan["verdict"] is not None and sum(last - first + 1 for g in groups for first, last in g["chips"]) == num_chips
    )
    OUTPUT.mkdir(parents=True, exist_ok=True)
    shot = OUTPUT / f"plan_{num_chips}_chips.png"
    shot.unlink(missing_ok=True)
    with chromium() as browser, browser.page(f"{server}/plans/{record['id']}/view", WIDTH, VIEWPORT_HEIGHT) as page:
        got = page.evaluate(MEASURE)
        page.screenshot(shot)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    print(f"{num_chips} chips: page {got['height']} px tall, scrollWidth {got['scrollWidth']} at {WIDTH} px; {shot}")
    # A few screens tall, never wider than the window.
    assert got["height"] < MAX_PAGE_HEIGHT
    assert got["scrollWidth"] <= got["innerWidth"] and got["widest"] <= got["innerWidth"]
    # The verdict is the first thing seen, whole, without scrolling.
    verdict = got["verdict"]
    assert verdict is not None and verdict["top"] >= 0 and verdict["bottom"] <= got["innerHeight"]
    assert plan["verdict"]["summary"] in got["verdictText"]
    # Bars: a pair per chip at 8 chips, a few aggregate pairs at 256; the mesh fits about 600 px.
    assert got["chipBars"] == (num_chips if num_chips <= 16 else len(groups))
    assert got["mesh"]["width"] <= 620 and got["mesh"]["height"] <= 620
    # The timeline: before and after for the entry and each loop body, every line's peak marked.
    assert got["timelines"] == 2 * (1 + len(plan["loops"])) == got["peaks"]
    text = got["text"]
    assert f"all {num_chips} chips" in text
    assert not re.search(r"\b0, 1, 2, 3, 4, 5\b", text)  # no list of chip ids
    # Shardings in XLA's short form: no device list of a whole mesh written out.
    assert "<=[" in text and not re.search(r"\d+(,\d+){15}", text)


# One weight split 4 ways on dim 0 and 2 ways on dim 1: plans in well under a second.
SMALL_HLO = (
    "HloModule pasted_step, num_partitions=8\n\nENTRY e {\n  p = f32[8,1024]{1,0} parameter(0), "
    "sharding={devices=[4,2]<=[8]}\n  ROOT n = f32[8,1024]{1,0} negate(p)\n}\n"
)


def _submit(page, browser) -> str:  # type: ignore[no-untyped-def]
    """Submits the dashboard's form as a click would, and returns the address the browser lands on."""
    page.evaluate("setTimeout(() => document.querySelector('form button[type=submit]').click(), 50); true")
    browser.wait_event("Page.loadEventFired", page.session)
    return str(page.evaluate("location.pathname"))


@pytest.mark.browser
def test_the_form_plans_pasted_and_uploaded_hlo_and_keeps_pasted_text_on_error(server: str, tmp_path: Path) -> None:
    with chromium() as browser:
        # Pasted, no file chosen: the browser still sends an empty file part, which is no file.
        with browser.page(f"{server}/", WIDTH, VIEWPORT_HEIGHT) as page:
            page.evaluate(f"document.getElementById('hlo').value = {json.dumps(SMALL_HLO)}; true")
            landed = _submit(page, browser)
            assert re.fullmatch(r"/plans/[0-9a-f]+/view", landed), page.evaluate("document.body.innerText")
            assert "pasted_step" in page.evaluate("document.body.innerText")
        # Uploaded, nothing pasted.
        upload = tmp_path / "uploaded_step.hlo"
        upload.write_text(SMALL_HLO.replace("pasted_step", "uploaded_step"))
        with browser.page(f"{server}/", WIDTH, VIEWPORT_HEIGHT) as page:
            root = browser.send("DOM.getDocument", session=page.session)["root"]["nodeId"]
            node = browser.send("DOM.querySelector", {"nodeId": root, "selector": "#hlo_file"}, page.session)
            browser.send("DOM.setFileInputFiles", {"files": [str(upload)], "nodeId": node["nodeId"]}, page.session)
            landed = _submit(page, browser)
            assert re.fullmatch(r"/plans/[0-9a-f]+/view", landed), page.evaluate("document.body.innerText")
            assert "uploaded_step" in page.evaluate("document.body.innerText")
        # A parse error: the message with its line, and the pasted text still there to fix.
        bad = "HloModule m\n\nENTRY e {\n  ROOT a = f32[4] add(p, q)\n}\n"
        with browser.page(f"{server}/", WIDTH, VIEWPORT_HEIGHT) as page:
            page.evaluate(f"document.getElementById('hlo').value = {json.dumps(bad)}; true")
            assert _submit(page, browser) == "/"
            assert "4:23: operand 'p' of 'a' is not defined" in page.evaluate(
                "document.getElementById('form-error').innerText"
            )
            assert page.evaluate("document.getElementById('hlo').value") == bad


# Each finding's split and each placement's line, as the page holds them at a laptop's width and a phone's.
PLACEMENTS_AND_SPLITS = """(() => ({
  scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth,
  findings: document.querySelectorAll("#findings tr.finding").length,
  splits: document.querySelectorAll("#findings tr.split-row svg.split:first-of-type").length,
  causeSplits: document.querySelectorAll("#findings tr.split-row svg.split").length
    - document.querySelectorAll("#findings tr.split-row").length,
  placements: [...document.querySelectorAll("#placements .placement")].map((p) => ({
    text: p.innerText,
    code: (p.querySelector("pre.user-code") || {}).textContent || null,
    copies: (p.querySelector("button.copy") || {dataset: {}}).dataset.target || null,
  })),
}))()"""

JAX_STEP = REPO.parent / "shared" / "corpus" / "jax" / "jax_llama_scan_L8_fsdp4_tp2.hlo"
STEPS = [
    # A torch_xla dump names no parameter: no line to paste, the plan says why.
    pytest.param(DEFAULT_DUMP, {"shape": [4, 2], "axis_names": ["fsdp", "tp"]}, None, id="torch_xla_8_chips"),
    pytest.param(JAX_STEP, {"shape": [4, 2], "axis_names": ["fsdp", "tp"]}, "jax.lax.with_sharding_constraint",
                 id="jax_8_chips"),
    pytest.param(LLAMA_405B, {"shape": [64, 4], "axis_names": ["fsdp", "tp"]}, "jax.lax.with_sharding_constraint",
                 id="jax_256_chips"),
]  # fmt: skip


@pytest.mark.browser
@pytest.mark.parametrize("width", [1280, 420])
@pytest.mark.parametrize("hlo,mesh,line", STEPS)
def test_every_placement_has_its_line_and_every_finding_its_split_at_1280_and_420_px(
    server: str, hlo: Path, mesh: dict, line: str | None, width: int
) -> None:
    record = post_json(f"{server}/plan", {"hlo": hlo.read_text(), "mesh": mesh, "chip": "v5p"})
    plan = record["plan"]
    name = f"plan_{hlo.stem[:24]}_{width}px.png"
    with chromium() as browser, browser.page(f"{server}/plans/{record['id']}/view", width, VIEWPORT_HEIGHT) as page:
        got = page.evaluate(PLACEMENTS_AND_SPLITS)
        OUTPUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(OUTPUT / name)
    # No sideways scrolling at either width.
    assert got["scrollWidth"] <= got["innerWidth"], (width, got["scrollWidth"])
    # Every finding drawn against the mesh axes; every root cause's op drawn with its operands and result (the
    # largest findings' pictures open, the rest a click away).
    assert got["findings"] == len(plan["findings"]) > 0
    assert got["splits"] == got["findings"]
    assert got["causeSplits"] == sum(1 for f in plan["findings"] if f["root_cause"] and f["root_cause"]["result"])
    # Every placement: the user's summary with a PartitionSpec, and a copy button for the framework's line, or,
    # where the step names no parameter (a torch_xla dump without a manifest), why there is no line and a copy
    # button for the HLO edits.
    assert len(got["placements"]) == len(plan["placements"]) > 0
    for shown, p in zip(got["placements"], plan["placements"]):
        user = p["user"]
        assert user is not None and user["spec"] is not None, p["id"]
        assert user["summary"] in shown["text"]
        assert "<the weight>" not in shown["text"]
        if line is None:
            assert user["code"] is None and shown["code"] is None
            assert f"no torch_xla line: {user['missing']}" in shown["text"]
            assert shown["copies"] is not None and shown["copies"].startswith("placement-")
            continue
        assert shown["code"] is not None and line in shown["code"] and user["spec"] in shown["code"]
        assert shown["copies"] is not None and shown["copies"].startswith("placement-code-")

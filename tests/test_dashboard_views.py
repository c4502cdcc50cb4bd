"""The dashboard at scale, without a browser: what the views compute for 8 to 1,024 chips, and the page.

Larger plans are the bundled dump's real plan with its numbers spread over a larger mesh; the
browser test (`test_dashboard_browser.py`) renders real 8- and 256-chip plans in Chromium.
"""

from __future__ import annotations

import functools
import re

import pytest
from fastapi.testclient import TestClient

from api import create_app
from api.settings import Settings
from api.timeline_view import timelines
from api.views import MAX_CHIP_BARS, MESH_BOX, hbm_chart, human_bytes, mesh_grid
from planner import parse_hlo_file
from planner.data import DEFAULT_DUMP
from planner.mesh import Mesh
from planner.plan.chip_groups import chip_groups, chip_ranges
from planner.plan.model import Plan, VerdictInfo
from planner.plan.planner import make_plan
from planner.prepare import prepare

GIB = 1 << 30


@functools.cache
def real_plan() -> Plan:
    plan, _ = make_plan(prepare(parse_hlo_file(DEFAULT_DUMP), mesh=Mesh.parse("fsdp=4,tp=2")), 600 << 20)
    return plan


def plan_on(mesh: str | None, num_chips: int, before: dict[int, int] | None = None) -> Plan:
    """The bundled dump's plan, its per-chip numbers spread over `num_chips` chips."""
    plan = real_plan().model_copy(deep=True)
    total_before, total_after = plan.hbm.total_before, plan.hbm.total_after
    plan.mesh = mesh
    plan.hbm.per_chip_before = {str(d): (before or {}).get(d, total_before) for d in range(num_chips)}
    plan.hbm.per_chip_after = {str(d): total_after for d in range(num_chips)}
    return plan


SCALES = [("fsdp=4,tp=2", 8), ("fsdp=16,tp=4", 64), ("fsdp=64,tp=4", 256), (None, 256), ("fsdp=256,tp=4", 1024),
          ("data=4,fsdp=64,tp=4", 1024)]  # fmt: skip


@pytest.mark.parametrize("mesh,num_chips", SCALES, ids=[f"{m or 'no_mesh'}" for m, _ in SCALES])
def test_chart_and_mesh_stay_small_at_any_scale(mesh: str | None, num_chips: int) -> None:
    plan = plan_on(mesh, num_chips)
    chart = hbm_chart(plan)
    assert len(chart.bars) == (num_chips if num_chips <= MAX_CHIP_BARS else 1)
    assert chart.per_chip == (num_chips <= MAX_CHIP_BARS)
    grid = mesh_grid(plan)
    assert grid.width <= MESH_BOX and grid.height <= MESH_BOX and len(grid.cells) == num_chips
    # Roughly square, whatever the mesh's shape: no line of 256 cells.
    assert max(grid.width, grid.height) <= 4 * min(grid.width, grid.height)
    assert grid.cell >= (48 if num_chips <= 8 else 12)
    assert len({(c.x, c.y) for c in grid.cells}) == num_chips  # no two chips on one cell
    assert [g.label for g in chip_groups(plan)] == [f"all {num_chips:,} chips"]


def test_distinct_values_become_a_histogram_then_min_median_max() -> None:
    few = plan_on("fsdp=64,tp=4", 256, {0: 900 << 20, 1: 900 << 20, 7: 10 << 20})
    assert [g.label for g in chip_groups(few)] == ["2 chips (0-1)", "253 chips (2-6, 8-255)", "chip 7"]
    assert [b.label for b in hbm_chart(few).bars] == ["1 chip", "253 chips", "2 chips"]
    many = plan_on("fsdp=64,tp=4", 256, {d: (100 + d) << 20 for d in range(0, 256, 16)})
    assert [b.label for b in hbm_chart(many).bars] == ["min", "median", "max"]


def test_chip_ids_are_ranges_never_a_list() -> None:
    assert chip_ranges(["3", "0", "1", "2", "7", "9", "10"]) == "0-3, 7, 9-10"
    assert chip_ranges([str(d) for d in range(0, 512, 2)]) == "0, 2, 4, …"


def with_verdict(plan: Plan) -> Plan:
    plan.verdict = VerdictInfo(
        capacity_bytes=600 << 20, chip=None, fits_before=False, fits_after=True, call_before="does not fit",
        call_after="fits", worst_chip_before="0",
        worst_before_bytes=plan.hbm.total_before, worst_chip_after="0", worst_after_bytes=plan.hbm.total_after,
        margin_before_bytes=(600 << 20) - plan.hbm.total_before, margin_after_bytes=(600 << 20) - plan.hbm.total_after,
        change_set=[p.id for p in plan.placements], change_set_name="pin every scanned parameter",
        saves_bytes=plan.hbm.total_before - plan.hbm.total_after, summary="Does not fit in 600.0 MiB; fits after the plan.",
    )  # fmt: skip
    return plan


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    return TestClient(create_app(Settings(db_path=tmp_path_factory.mktemp("views") / "plans.sqlite3")))


def page(client: TestClient, plan_id: str, plan: Plan) -> str:
    summary = {"module": plan.module, "mesh": plan.mesh, "capacity_bytes": plan.hbm.capacity_bytes,
               "total_before": plan.hbm.total_before, "total_after": plan.hbm.total_after,
               "num_findings": len(plan.findings)}  # fmt: skip
    client.app.state.store.put(plan_id, plan.model_dump_json(), "HloModule m", summary)  # type: ignore[attr-defined]
    response = client.get(f"/plans/{plan_id}/view")
    assert response.status_code == 200
    return response.text


def test_verdict_comes_first_and_only_when_there_is_one(client: TestClient) -> None:
    html = page(client, "with-verdict", with_verdict(plan_on("fsdp=4,tp=2", 8)))
    assert html.index('id="verdict"') < html.index("<h1>")
    assert "Does not fit in 600.0 MiB; fits after the plan." in html and "over by" in html and "to spare" in html
    assert 'id="summary"' not in html  # the verdict says it
    assert '<span class="badge no">does not fit</span>' in html and '<span class="badge ok">fits</span>' in html
    close = with_verdict(plan_on("fsdp=4,tp=2", 8))
    assert close.verdict is not None
    close.verdict = close.verdict.model_copy(update={"call_after": "too close to call", "fits_after": None})
    assert '<span class="badge info">too close to call</span>' in page(client, "too-close", close)
    plain = page(client, "no-verdict", plan_on("fsdp=4,tp=2", 8).model_copy(update={"verdict": None}))
    assert 'id="verdict"' not in plain and 'id="summary"' in plain


def test_page_at_1024_chips_names_no_chip_list(client: TestClient) -> None:
    html = page(client, "chips-1024", with_verdict(plan_on("fsdp=256,tp=4", 1024)))
    assert len(re.findall(r'<rect class="after"', html)) == 1
    assert "all 1,024 chips" in html
    text = re.sub(r"<title>.*?</title>", "", html)  # a chip's own tooltip names it, nothing else lists them
    assert not re.search(r"\b0, 1, 2, 3\b", text) and "chip 1023" not in text
    assert len(html) < 600_000


def test_timelines_share_one_scale_and_mark_each_peak() -> None:
    plan = plan_on("fsdp=4,tp=2", 8)
    drawn = timelines(plan)
    assert drawn is not None
    assert [c.label for c in drawn.charts] == [s.label for s in plan.timeline_before]
    for chart, series in zip(drawn.charts, plan.timeline_before):
        assert chart.before is not None and chart.after is not None
        assert chart.before.peak.bytes == max(series.live_bytes)
        assert chart.before.points.count(" ") + 1 == len(series.live_bytes)
    # Plans stored before timelines existed have none: the page leaves the card out.
    assert timelines(plan.model_copy(update={"timeline_before": [], "timeline_after": []})) is None


def test_hovering_a_timeline_names_what_runs_there_and_the_bytes_live() -> None:
    plan = plan_on("fsdp=4,tp=2", 8)
    drawn = timelines(plan)
    assert drawn is not None
    after = {s.computation: s for s in plan.timeline_after}
    for chart, series in zip(drawn.charts, plan.timeline_before):
        assert 0 < len(chart.strips) <= 80
        # The strips tile the plot left to right, and the one at the peak says the peak's bytes.
        assert chart.strips[0].x == drawn.plot_left
        end = chart.strips[-1].x + chart.strips[-1].width
        assert abs(end - drawn.plot_right) < 0.01
        peak = max(series.live_bytes)
        at_peak = [s.text for s in chart.strips if series.positions[series.peak_index] in s.text]
        assert at_peak and any(f"before: {human_bytes(peak)} live" in t for t in at_peak), at_peak[:2]
        assert all("after the plan: " in s.text for s in chart.strips) == (chart.computation in after)


def test_host_memory_shows_beside_hbm_only_where_the_step_offloads(client: TestClient) -> None:
    plain = page(client, "no-offload", with_verdict(plan_on("fsdp=4,tp=2", 8)))
    assert 'id="host-memory"' not in plain
    offloading = with_verdict(plan_on("fsdp=4,tp=2", 8))
    offloading.hbm.host_before = offloading.hbm.host_after = 4864 << 20
    html = page(client, "offload", offloading)
    assert 'id="host-memory"' in html and "4.8 GiB" in html and "not HBM" in html

"""Search reports on the service: stored by content, read back, drawn on the dashboard."""

from __future__ import annotations

from fastapi.testclient import TestClient

from api import create_app
from api.settings import Settings
from planner.wire import SearchReportBody, SearchRow

GIB = 1 << 30
REPORT = SearchReportBody(
    builder="search_llama_jax:build_405b",
    rows=[
        SearchRow(candidate="fsdp=64,tp=4 remat=full microbatches=4 v6e", capacity_bytes=32 * GIB,
                  predicted_after_bytes=18 * GIB, headroom_bytes=14 * GIB, flops_per_batch=7 * 10**15,
                  compiler="XLA:TPU (v6e:16x16)", compiled_bytes=19 * GIB),
        SearchRow(candidate="fsdp=16,tp=16 remat=full microbatches=4 v6e", capacity_bytes=32 * GIB,
                  predicted_after_bytes=42 * GIB, headroom_bytes=-10 * GIB, flops_per_batch=7 * 10**15),
        SearchRow(candidate="fsdp=1,tp=256 remat=none microbatches=1 v6e", capacity_bytes=32 * GIB,
                  predicted_after_bytes=1100 * GIB, headroom_bytes=-1068 * GIB, flops_per_batch=6 * 10**15),
        SearchRow(candidate="fsdp=256,tp=1 remat=none microbatches=2 v6e", error="ValueError: does not divide"),
    ],
)  # fmt: skip


def test_a_search_is_stored_by_content_and_read_back(store_url: str) -> None:
    client = TestClient(create_app(Settings(db=store_url)))
    first = client.post("/searches", json=REPORT.model_dump()).json()
    again = client.post("/searches", json=REPORT.model_dump()).json()
    assert first["id"] == again["id"] == REPORT.content_hash() and first["created_at"] == again["created_at"]
    read = client.get(f"/searches/{first['id']}")
    assert read.status_code == 200 and SearchReportBody.model_validate(read.json()["report"]) == REPORT
    assert client.get("/searches/nothing").json() == {"detail": "no search 'nothing'"}
    assert client.post("/searches", json={"builder": "m:f", "rows": []}).status_code == 422


def test_the_dashboard_draws_one_bar_per_planned_candidate_under_the_capacity_line(store_url: str) -> None:
    client = TestClient(create_app(Settings(db=store_url)))
    search_id = client.post("/searches", json=REPORT.model_dump()).json()["id"]
    page = client.get(f"/searches/{search_id}/view").text
    assert page.count('<g class="candidate">') == 3  # the failed candidate has no bar, only its row
    assert page.count('class="compiled"') == 1 and "XLA:TPU (v6e:16x16): 19.0 GiB" in page
    assert 'id="capacity"' in page and ">32.0 GiB</text>" in page
    # Drawn to twice the capacity: the 18 GiB bar is 18/64 of the plot, the 1.1 TiB one runs to its edge.
    assert 'width="118.1"' in page and 'width="420.0"' in page and "1.1 TiB &#8594;" in page
    assert "failed: ValueError: does not divide" in page and "over by 10.0 GiB" in page


def test_storing_a_search_needs_the_token_when_one_is_set(store_url: str) -> None:
    client = TestClient(create_app(Settings(db=store_url, token="secret")))
    assert client.post("/searches", json=REPORT.model_dump()).status_code == 401
    headers = {"Authorization": "Bearer secret"}
    assert client.post("/searches", json=REPORT.model_dump(), headers=headers).status_code == 200


def test_a_search_far_below_capacity_is_drawn_to_its_own_scale_and_says_how_compiled_compares(store_url: str) -> None:
    mib = 1 << 20
    small = SearchReportBody(
        builder="search_llama_jax:build_small",
        rows=[SearchRow(candidate="fsdp=4,tp=2 remat=none microbatches=1 v6e", capacity_bytes=32 * GIB,
                        predicted_after_bytes=int(16.5 * mib), headroom_bytes=32 * GIB - int(16.5 * mib),
                        flops_per_batch=10**12, compiler="XLA:TPU (v6e:2x4)", compiled_bytes=int(61.3 * mib))],
    )  # fmt: skip
    client = TestClient(create_app(Settings(db=store_url)))
    search_id = client.post("/searches", json=small.model_dump()).json()["id"]
    page = client.get(f"/searches/{search_id}/view").text
    # On a 64 GiB axis both would be under a pixel wide; on the candidates' own scale they are visible.
    assert "every candidate is under half the chip&#39;s 32.0 GiB, which is off this scale" in page
    assert 'id="capacity"' not in page
    bar = float(page.split('<rect x="360" y="4" width="')[1].split('"')[0])
    assert bar > 80
    assert "XLA:TPU (v6e:2x4) allocates 61.3 MiB for the step with its plan: 3.7x the prediction" in page

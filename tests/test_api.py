"""The service through its test client: every endpoint, every error status, caching, restarts."""

from __future__ import annotations

import gzip
import json
import re
import sys

import pytest
from conftest import CORPUS
from fastapi.testclient import TestClient

from api import create_app
from api.job_models import JobList, JobRecord
from api.openapi_examples import example_plan, make_example
from api.settings import Settings
from api.worker import PlanWorkers
from planner import parse_hlo
from planner.data import DEFAULT_DUMP
from planner.plan.model import Plan
from planner.wire import JobRequest, PlanRecord, PlanRequest

DUMP = DEFAULT_DUMP.read_text()
MESH = {"shape": [4, 2], "axis_names": ["fsdp", "tp"]}
BAD_HLO = "HloModule m\n\nENTRY e {\n  ROOT a = f32[4] add(p, q)\n}\n"


def client(store_url: str, **settings: object) -> TestClient:
    """The service on the test's store: every test taking `store_url` runs on SQLite and on PostgreSQL."""
    return TestClient(create_app(Settings(db=store_url, **settings)))


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def shared(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[TestClient, dict]:
    """One service with the bundled dump planned once (planning takes seconds), for XLA:CPU with 32 GiB a chip:
    its stacked gradients lose an axis there, and the plan pins them. Once on each store."""
    if request.param == "sqlite":
        store = f"sqlite:///{tmp_path_factory.mktemp('api') / 'plans.sqlite3'}"
    else:
        store = request.getfixturevalue("postgres").new_database()
    c = client(store)
    response = c.post("/plan", json={"hlo": DUMP, "mesh": MESH, "hbm_bytes": 32 << 30})
    assert response.status_code == 200, response.text
    return c, response.json()


def test_post_plan_returns_the_plan_and_the_same_request_is_cached(shared: tuple[TestClient, dict]) -> None:
    c, first = shared
    assert first["cached"] is False
    plan = first["plan"]
    assert plan["mesh"] == "fsdp=4,tp=2" and plan["hbm"]["capacity_bytes"] == 32 << 30
    assert plan["hbm"]["total_after"] < plan["hbm"]["total_before"]
    assert any(f["kind"] == "stacked-gradient" for f in plan["findings"])
    again = c.post("/plan", json={"hlo": DUMP, "mesh": MESH, "hbm_bytes": 32 << 30}).json()
    assert again["cached"] is True and again["id"] == first["id"] and again["plan"] == plan
    # A chip preset plans for that chip's compiler: XLA:TPU keeps these gradients sharded as their weights.
    tpu = c.post("/plan", json={"hlo": DUMP, "mesh": MESH, "chip": "v6e"}).json()
    assert tpu["id"] != first["id"] and tpu["plan"]["verdict"]["chip"] == "v6e"
    assert not any(f["kind"] == "stacked-gradient" for f in tpu["plan"]["findings"])
    assert tpu["plan"]["hbm"]["total_before"] != plan["hbm"]["total_before"]
    # A different setting is a different plan.
    other = c.post("/plan", json={"hlo": DUMP, "mesh": MESH, "hbm_bytes": 1 << 30, "options": {"min_bytes": 1 << 22}})
    assert other.status_code == 200 and other.json()["id"] != first["id"] and other.json()["cached"] is False


def test_get_plan_list_and_patched_module(shared: tuple[TestClient, dict]) -> None:
    c, first = shared
    got = c.get(f"/plans/{first['id']}")
    assert got.status_code == 200 and got.json()["plan"] == first["plan"]
    page = c.get("/plans", params={"limit": 1}).json()
    assert page["limit"] == 1 and page["total"] >= 1 and len(page["items"]) == 1
    assert set(page["items"][0]) >= {"id", "module", "total_before", "total_after", "num_findings", "chip", "verdict"}
    everything = c.get("/plans", params={"limit": 100}).json()
    listed = {item["id"]: item for item in everything["items"]}
    verdict = first["plan"]["verdict"]
    assert (listed[first["id"]]["chip"], listed[first["id"]]["verdict"]) == (verdict["chip"], verdict["call_after"])
    assert first["id"] in {item["id"] for item in everything["items"]}
    assert c.get("/plans", params={"limit": 1, "offset": everything["total"]}).json()["items"] == []
    patched = c.get(f"/plans/{first['id']}/patched.hlo")
    assert patched.status_code == 200
    module = parse_hlo(patched.text)
    assert any(i.name.endswith(".pinned") for comp in module.computations for i in comp)
    assert c.get("/plans/nope").status_code == 404
    assert c.get("/plans/nope/patched.hlo").status_code == 404
    assert c.get("/healthz").json() == {"status": "ok", "stored_plans": everything["total"]}


def test_file_upload_plain_and_gzip_find_the_stored_plan(shared: tuple[TestClient, dict]) -> None:
    c, first = shared
    form = {"mesh": "fsdp=4,tp=2", "chip": "32GiB"}  # the form's one box takes a preset or a byte count
    plain = c.post("/plan", data=form, files={"hlo_file": ("step.hlo", DUMP.encode())})
    packed = c.post("/plan", data=form, files={"hlo_file": ("step.hlo.gz", gzip.compress(DUMP.encode()))})
    for response in (plain, packed):
        assert response.status_code == 200, response.text
        assert response.json()["id"] == first["id"] and response.json()["cached"] is True


def test_parse_errors_are_422_with_line_and_column(store_url: str) -> None:
    c = client(store_url)
    response = c.post("/plan", json={"hlo": BAD_HLO})
    assert response.status_code == 422
    body = response.json()
    assert (body["line"], body["column"]) == (4, 23)
    assert "operand 'p' of 'a' is not defined" in body["detail"]
    upload = c.post("/plan", files={"hlo_file": ("bad.hlo.gz", gzip.compress(BAD_HLO.encode()))})
    assert upload.status_code == 422 and upload.json()["line"] == 4


def test_a_form_takes_the_file_or_the_text_and_an_empty_file_part_is_no_file(store_url: str) -> None:
    c = client(store_url)
    small = "HloModule m, num_partitions=8\n\nENTRY e {\n  ROOT p = f32[8,16] parameter(0), sharding={devices=[8,1]<=[8]}\n}\n"
    # What a browser sends for a file input left alone beside pasted text.
    pasted = c.post("/plan", data={"hlo": small}, files={"hlo_file": ("", b"")})
    assert pasted.status_code == 200, pasted.text
    both = c.post("/plan", data={"hlo": small}, files={"hlo_file": ("step.hlo", small.encode())})
    assert both.status_code == 422 and "both an HLO file and pasted HLO text" in both.json()["detail"]


def test_one_contract_units_in_forms_one_error_shape_every_answer_documented(store_url: str) -> None:
    c = client(store_url)
    # A form's byte counts take a unit, as the command line's do; JSON's *_bytes fields are integers.
    for field in ("chip", "hbm_bytes", "min_bytes"):
        bare = c.post("/plan", data={"hlo": DUMP, field: "32"})
        assert bare.status_code == 422 and bare.json() == {"detail": "'32' needs a unit: 32GiB, 32GB, 32MiB or 32B"}
    # FastAPI's own validation answers in the shape every other error has: one string.
    listing = c.get("/plans?limit=abc")
    assert listing.status_code == 422 and isinstance(listing.json()["detail"], str)
    assert listing.json()["detail"].startswith("query.limit: ")
    # Each status /plan answers is in the OpenAPI document.
    documented = set(c.get("/openapi.json").json()["paths"]["/plan"]["post"]["responses"])
    assert {"200", "401", "413", "415", "422", "500", "504"} <= documented
    assert c.post("/plan", content=b"x", headers={"content-type": "text/plain"}).status_code == 415


def test_bytes_per_chip_come_one_entry_per_value_and_every_chip_on_request(shared: tuple[TestClient, dict]) -> None:
    c, first = shared
    hbm = first["plan"]["hbm"]
    # The bundled step's 8 chips hold the same bytes: one entry, chips 0-7.
    assert hbm["per_chip_before"] == [{"bytes": hbm["total_before"], "chips": [[0, 7]]}]
    every = c.get(f"/plans/{first['id']}?every_chip=true").json()["plan"]["hbm"]
    assert every["per_chip_before"] == {str(d): hbm["total_before"] for d in range(8)}
    assert c.get(f"/plans/{first['id']}").json()["plan"]["hbm"]["per_chip_before"] == hbm["per_chip_before"]


def test_a_tuple_shape_nested_500_deep_is_a_located_422(store_url: str) -> None:
    shape = "(" * 500 + "f32[]" + ")" * 500
    response = client(store_url).post(
        "/plan", json={"hlo": f"HloModule m\n\nENTRY e {{\n  ROOT p = {shape} parameter(0)\n}}\n"}
    )
    assert response.status_code == 422, response.text
    body = response.json()
    assert (body["line"], body["column"]) == (4, 76) and "tuple shape nested more than 64 deep" in body["detail"]


def test_a_cut_short_or_corrupt_gzip_upload_is_422(store_url: str) -> None:
    c = client(store_url)
    packed = gzip.compress(DUMP.encode())
    short = c.post("/plan", files={"hlo_file": ("step.hlo.gz", packed[: len(packed) // 2])})
    assert short.status_code == 422 and "ends before its end-of-stream marker" in short.json()["detail"]
    corrupt = packed[:10] + bytes(b ^ 0x5A for b in packed[10:200]) + packed[200:]
    bad = c.post("/plan", files={"hlo_file": ("step.hlo.gz", corrupt)})
    assert bad.status_code == 422 and "does not decompress" in bad.json()["detail"]


@pytest.mark.parametrize(
    "body,message",
    [
        ({"mesh": MESH}, "hlo: Field required"),
        ({"hlo": DUMP, "mesh": {"shape": [4, 2], "axis_names": ["fsdp"]}}, "does not match axis_names"),
        ({"hlo": DUMP, "chip": "v9"}, "unknown chip 'v9'"),
        ({"hlo": DUMP, "chip": "v6e", "hbm_bytes": 5}, "give chip or hbm_bytes, not both"),
        (
            {"hlo": DUMP, "mesh": {"shape": [2, 2], "axis_names": ["fsdp", "tp"]}},
            "has 4 devices but the module has num_partitions=8",
        ),
    ],
    ids=["no-hlo", "mesh-names", "chip", "two-capacities", "mesh-size"],
)
def test_bad_settings_are_422_with_the_reason(store_url: str, body: dict, message: str) -> None:
    response = client(store_url).post("/plan", json=body)
    assert response.status_code == 422
    assert message in response.json()["detail"]


def test_size_limits_are_413(store_url: str) -> None:
    c = client(store_url, max_body_bytes=100_000)
    assert c.post("/plan", json={"hlo": DUMP}).status_code == 413
    # A small gzip that inflates past the limit is refused while inflating.
    bomb = gzip.compress(b"HloModule m\n" + b" " * 5_000_000)
    assert len(bomb) < 100_000
    response = c.post("/plan", files={"hlo_file": ("x.hlo.gz", bomb)})
    assert response.status_code == 413 and "once decompressed" in response.json()["detail"]
    # Chunked (no Content-Length) bodies are counted as they arrive.
    chunks = (b"x" * 10_000 for _ in range(20))
    streamed = c.post("/plan", content=chunks, headers={"content-type": "application/json"})
    assert streamed.status_code == 413


def test_wrong_content_type_is_415(store_url: str) -> None:
    assert client(store_url).post("/plan", content=b"x", headers={"content-type": "text/plain"}).status_code == 415


def test_time_limit_is_504_and_the_server_keeps_serving(store_url: str) -> None:
    c = client(store_url, time_limit_seconds=0.5)
    response = c.post("/plan", json={"hlo": DUMP, "mesh": MESH})
    assert response.status_code == 504
    assert "time limit of 0.5 s" in response.json()["detail"]
    assert c.get("/healthz").status_code == 200
    assert c.get("/plans").json()["total"] == 0  # nothing half-made was stored


def test_a_dying_worker_is_500_and_the_next_plan_still_runs(store_url: str) -> None:
    c = client(store_url)
    workers = c.app.state.workers  # type: ignore[attr-defined]
    c.app.state.workers = PlanWorkers(1, 60, command=(sys.executable, "-c", "import os; os.abort()"))  # type: ignore[attr-defined]
    response = c.post("/plan", json={"hlo": BAD_HLO})
    assert response.status_code == 500 and "the planner process died" in response.json()["detail"]
    c.app.state.workers = workers  # type: ignore[attr-defined]
    assert c.post("/plan", json={"hlo": BAD_HLO}).status_code == 422


def test_bearer_token_guards_posting(store_url: str) -> None:
    c = client(store_url, token="s3cret")
    assert c.post("/plan", json={"hlo": BAD_HLO}).status_code == 401
    assert c.post("/plan", json={"hlo": BAD_HLO}, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert c.post("/plan", json={"hlo": BAD_HLO}, headers={"Authorization": "Bearer s3cret"}).status_code == 422
    assert c.get("/plans").status_code == 200  # reading stays open
    form = c.post("/", data={"hlo": BAD_HLO, "token": "wrong"})
    assert form.status_code == 401 and "token" in form.text


def test_plans_survive_a_restart(store_url: str) -> None:
    small = (CORPUS / "torch_xla" / "llama_scan_L4_small.hlo").read_text()
    first = client(store_url).post("/plan", json={"hlo": small, "mesh": MESH}).json()
    restarted = client(store_url)
    assert restarted.get(f"/plans/{first['id']}").json()["plan"] == first["plan"]
    again = restarted.post("/plan", json={"hlo": small, "mesh": MESH}).json()
    assert again["cached"] is True and again["id"] == first["id"]
    assert restarted.get("/plans").json()["total"] == 1


def test_cors_is_off_unless_configured(store_url: str) -> None:
    headers = {"Origin": "https://example.org", "Access-Control-Request-Method": "POST"}
    assert "access-control-allow-origin" not in client(store_url).options("/plan", headers=headers).headers
    allowed = client(store_url, cors_origins=["https://example.org"]).options("/plan", headers=headers)
    assert allowed.headers["access-control-allow-origin"] == "https://example.org"


def test_openapi_documents_every_model_with_examples(store_url: str) -> None:
    schema = client(store_url).get("/openapi.json").json()
    components = schema["components"]["schemas"]
    wanted = {"PlanRequest", "PlanRecord", "Plan", "FindingInfo", "PlacementInfo", "PlanPage", "ErrorDetail", "Health"}
    assert wanted <= set(components)
    ours = {name: c for name, c in components.items() if name not in ("HTTPValidationError", "ValidationError")}
    assert [name for name, c in ours.items() if not c.get("examples")] == []
    # The examples are what the models accept.
    assert Plan.model_validate(components["Plan"]["examples"][0])
    assert PlanRecord.model_validate(components["PlanRecord"]["examples"][0])
    assert PlanRequest.model_validate(components["PlanRequest"]["examples"][0])
    for name, model in (("JobRequest", JobRequest), ("JobRecord", JobRecord), ("JobList", JobList)):
        assert model.model_validate(components[name]["examples"][0]), name
    post = schema["paths"]["/plan"]["post"]
    assert {"application/json", "multipart/form-data"} <= set(post["requestBody"]["content"])
    assert {"200", "413", "422", "504"} <= set(post["responses"])


def test_dashboard_lists_plans_and_draws_one(shared: tuple[TestClient, dict]) -> None:
    c, first = shared
    index = c.get("/")
    assert index.status_code == 200 and f"/plans/{first['id']}/view" in index.text and "<form" in index.text
    page = c.get(f"/plans/{first['id']}/view")
    assert page.status_code == 200
    html = page.text
    assert len(re.findall(r'<rect class="after"', html)) == 8  # one bar per chip
    assert 'id="findings"' in html and "stacked-gradient" in html
    # No manifest: each placement says what it pins and why there is no torch_xla line; no placeholder stands
    # in for a weight the dump cannot name.
    assert "dot.1660" in html and "no torch_xla line: the dump names no parameter" in html
    assert "&lt;the weight&gt;" not in html and "xs.mark_sharding" not in html
    assert "http://" not in html and "https://" not in html  # nothing fetched from elsewhere
    assert c.get("/plans/nope/view").status_code == 404


def test_dashboard_form_plans_and_redirects(shared: tuple[TestClient, dict]) -> None:
    c, first = shared
    response = c.post("/", data={"hlo": DUMP, "mesh": "fsdp=4,tp=2", "chip": "32GiB"}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == f"/plans/{first['id']}/view"
    bad = c.post("/", data={"hlo": BAD_HLO, "mesh": "fsdp=4,tp=2"})
    assert bad.status_code == 422 and "not defined earlier" in bad.text


def test_hlo_strings_render_inert(store_url: str) -> None:
    """Metadata carrying markup and quotes is shown as text: the page keeps its one script of its own."""
    evil = """, metadata={op_name="<script>alert('op')</script>" source_file="/tmp/\\"><img src=x onerror=alert(1)>.py" source_line=7}"""
    at = DUMP.index("\n", DUMP.index("%dot.1660 = "))
    c = client(store_url)
    response = c.post("/plan", json={"hlo": DUMP[:at] + evil + DUMP[at:], "mesh": MESH})
    assert response.status_code == 200, response.text
    html = c.get(f"/plans/{response.json()['id']}/view").text
    assert "&lt;script&gt;alert(" in html
    assert html.count("<script") == 1  # the page's own copy-button script
    assert "<img" not in html and "onerror=alert(1)>" not in html
    # HLO's grammar has no room for markup in instruction names: such a name is refused with its place.
    named = c.post("/plan", json={"hlo": 'HloModule m\n\nENTRY e {\n  ROOT <script>"x = f32[4] parameter(0)\n}\n'})
    assert named.status_code == 422 and named.json()["line"] == 4


def test_openapi_json_is_valid_json_for_clients(store_url: str) -> None:
    text = client(store_url).get("/openapi.json").text
    assert json.loads(text)["info"]["title"] == "SPMD sharding planner"


def test_openapi_plan_example_is_the_planners_current_output() -> None:
    """The stored example is regenerated output, not prose: `python -m api.openapi_examples` rewrites it."""
    assert make_example() == example_plan()

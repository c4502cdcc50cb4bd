"""The service's answers to requests a user gets slightly wrong: an upload that does not parse, no body, a
misspelled field, a verify job with broken HLO, a plan page for an id nothing has, a capacity no chip has."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api import create_app
from api.settings import Settings

SMALL_HLO = (
    "HloModule m, num_partitions=8\n\nENTRY e {\n  p = f32[8,1024]{1,0} parameter(0), sharding={devices=[4,2]<=[8]}\n"
    "  ROOT n = f32[8,1024]{1,0} negate(p)\n}\n"
)
BAD_HLO = "HloModule m\n\nENTRY e {\n  ROOT a = f32[4] add(p, q)\n}\n"
MESH = {"shape": [4, 2], "axis_names": ["fsdp", "tp"]}


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    return TestClient(create_app(Settings(db_path=tmp_path / "plans.sqlite3")))


@pytest.mark.parametrize(
    "file_name,shown",
    [("mydump.hlo", "mydump.hlo"), ("C:\\dumps\\mydump.hlo", "mydump.hlo"), ("runs/7/step.hlo", "step.hlo")],
    ids=["plain", "windows_path", "folders"],
)
def test_an_upload_that_does_not_parse_is_named_by_its_file(client: TestClient, file_name: str, shown: str) -> None:
    answer = client.post("/plan", files={"hlo_file": (file_name, BAD_HLO.encode())})
    assert answer.status_code == 422
    body = answer.json()
    assert body["detail"].startswith(f"{shown}:4:23: operand 'p' of 'a' is not defined"), body
    assert (body["line"], body["column"]) == (4, 23)


def test_hlo_in_json_or_pasted_is_still_named_request(client: TestClient) -> None:
    assert client.post("/plan", json={"hlo": BAD_HLO}).json()["detail"].startswith("request:4:23: ")
    assert client.post("/plan", data={"hlo": BAD_HLO}).json()["detail"].startswith("request:4:23: ")


def test_the_dashboard_form_names_the_uploaded_file(client: TestClient) -> None:
    page = client.post("/", files={"hlo_file": ("mydump.hlo", BAD_HLO.encode())})
    assert page.status_code == 422 and "mydump.hlo:4:23: operand" in page.text


def test_a_post_with_no_body_is_415_saying_what_to_send(client: TestClient) -> None:
    answer = client.post("/plan")
    assert answer.status_code == 415
    assert answer.json() == {"detail": "the request has no body: send the plan request as application/json, or "
                                       "the HLO file as multipart/form-data (field `hlo_file`)"}  # fmt: skip
    # A body without a content type is still read as JSON.
    assert client.post("/plan", content=b'{"hlo": ""}').status_code == 422


@pytest.mark.parametrize(
    "path,body,message",
    [
        ("/plan", {"hlo": SMALL_HLO, "mseh": MESH}, "body: unknown field 'mseh': did you mean 'mesh'?"),
        (
            "/plan",
            {"hlo": SMALL_HLO, "options": {"treshold": 2}},
            "options: unknown field 'treshold': did you mean 'threshold'?",
        ),
        (
            "/plan",
            {"hlo": SMALL_HLO, "mesh": {**MESH, "axis_name": ["a", "b"]}},
            "mesh: unknown field 'axis_name': did you mean 'axis_names'?",
        ),
        (
            "/plan",
            {"hlo": SMALL_HLO, "zzz": 1},
            "body: unknown field 'zzz'; known: hlo, mesh, chip, hbm_bytes, libtpu, manifest, options",
        ),
        (
            "/jobs",
            {"kind": "verify", "requst": {"hlo": SMALL_HLO}},
            "body: unknown field 'requst': did you mean 'request'?",
        ),
        (
            "/jobs",
            {"kind": "search", "search": {"builder": "m:f", "devices": 8, "chip": ["v6e"]}},
            "body.search: unknown field 'chip': did you mean 'chips'?",
        ),
        (
            "/searches",
            {"builder": "m:f", "rows": [{"candidate": "fsdp=8", "headroom": 1}]},
            "body.rows.0: unknown field 'headroom': did you mean 'headroom_bytes'?",
        ),
    ],
    ids=["plan_mesh", "plan_options", "mesh_spec", "nothing_near", "job_request", "search_spec", "search_row"],
)
def test_a_misspelled_field_is_422_naming_it_and_the_nearest(
    client: TestClient, path: str, body: dict, message: str
) -> None:
    answer = client.post(path, json=body)
    assert answer.status_code == 422
    assert answer.json()["detail"] == message


def test_a_verify_job_whose_hlo_does_not_parse_is_refused_at_once(client: TestClient) -> None:
    sent: list[str] = []
    client.app.state.jobs.dispatch = lambda job: sent.append(job.id)  # type: ignore[attr-defined]
    answer = client.post("/jobs", json={"kind": "verify", "request": {"hlo": BAD_HLO, "mesh": MESH}})
    assert answer.status_code == 422
    body = answer.json()
    assert (body["line"], body["column"]) == (4, 23)
    assert body["detail"].startswith("request:4:23: operand 'p' of 'a' is not defined")
    assert client.get("/jobs").json() == {"items": []} and sent == []


@pytest.mark.parametrize("path,what", [("/plans", "plan"), ("/jobs", "job"), ("/searches", "search")],
                         ids=["plan", "job", "search"])  # fmt: skip
def test_a_page_for_an_id_nothing_has_is_an_html_404_with_the_way_back(
    client: TestClient, path: str, what: str
) -> None:
    page = client.get(f"{path}/0123abc/view")
    assert page.status_code == 404
    assert page.headers["content-type"].startswith("text/html")
    assert f"<h1>{what.capitalize()} not found</h1>" in page.text and "<code>0123abc</code>" in page.text
    assert '<a href="/">Back to the dashboard</a>' in page.text
    # The JSON API keeps its JSON 404.
    api = client.get(f"{path}/0123abc")
    assert api.status_code == 404 and api.json() == {"detail": f"no {what} '0123abc'"}


def test_an_hbm_no_chip_has_is_refused_by_the_service(client: TestClient) -> None:
    as_json = client.post("/plan", json={"hlo": SMALL_HLO, "mesh": MESH, "hbm_bytes": 10**18})
    assert as_json.status_code == 422
    assert as_json.json()["detail"].startswith(
        "hbm_bytes: Value error, HBM per chip of 1,000,000,000,000,000,000 bytes (909,494.7 TiB) is more than 1 PiB"
    )
    for field in ("hbm_bytes", "chip"):  # the dashboard's one box takes a preset or a byte count
        form = client.post("/plan", data={"hlo": SMALL_HLO, "mesh": "fsdp=4,tp=2", field: "1000000TB"})
        assert form.status_code == 422
        assert form.json()["detail"].startswith("HBM per chip of 1000000TB (909,494.7 TiB) is more than 1 PiB")
    job = client.post("/jobs", json={"kind": "verify", "request": {"hlo": SMALL_HLO, "hbm_bytes": 1 << 51}})
    assert job.status_code == 422 and "is more than 1 PiB" in job.json()["detail"]
    # 1 PiB itself is a capacity.
    assert client.post("/plan", json={"hlo": SMALL_HLO, "mesh": MESH, "hbm_bytes": 1 << 50}).status_code == 200

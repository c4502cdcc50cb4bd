"""The service's documentation works offline, every request is logged, plan ids change with the planner."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api import create_app
from api.settings import Settings
from planner.data import DEFAULT_DUMP
from planner.version import planner_version
from planner.wire import PlanRequest

# One weight split 4 ways on dim 0 and 2 ways on dim 1 over devices 0..7: a 4x2 mesh, not a 2x4 one.
SMALL_HLO = (
    "HloModule m, num_partitions=8\n\nENTRY e {\n  p = f32[8,1024]{1,0} parameter(0), sharding={devices=[4,2]<=[8]}\n"
    "  ROOT n = f32[8,1024]{1,0} negate(p)\n}\n"
)


def client(tmp_path: Path) -> TestClient:
    return TestClient(create_app(Settings(db_path=tmp_path / "plans.db")))


def test_docs_pages_load_only_local_assets(tmp_path: Path) -> None:
    c = client(tmp_path)
    for page in ("/docs", "/redoc"):
        html = c.get(page)
        assert html.status_code == 200
        urls = re.findall(r'(?:src|href)="([^"]+)"', html.text) + re.findall(r"url: ?'([^']+)'", html.text)
        assert urls and all(u.startswith("/") for u in urls), urls
        for url in urls:
            asset = c.get(url)
            assert (asset.status_code == 200 and len(asset.content) > 1000) or url.endswith("openapi.json"), url


def test_every_request_logs_one_line_with_plan_id_and_cache_use(tmp_path: Path, caplog) -> None:
    c = client(tmp_path)
    body = {"hlo": DEFAULT_DUMP.read_text(), "mesh": {"shape": [4, 2], "axis_names": ["fsdp", "tp"]}, "chip": "v6e"}
    with caplog.at_level(logging.INFO, logger="spmd_planner.api"):
        answer = c.post("/plan", json=body)
        again = c.post("/plan", json=body, headers={"X-Request-ID": "lb-1234.5"})
        health = c.get("/healthz", headers={"X-Request-ID": "not a plain token\t"})
    first = answer.json()
    lines = [r.getMessage() for r in caplog.records if r.name == "spmd_planner.api"]
    assert len(lines) == 3
    # Every answer names its request; the line says the same name. A caller's plain id is kept.
    mine = answer.headers["x-request-id"]
    assert re.fullmatch("[0-9a-f]{32}", mine) and again.headers["x-request-id"] == "lb-1234.5"
    assert re.fullmatch("[0-9a-f]{32}", health.headers["x-request-id"])
    assert re.fullmatch(rf"POST /plan 200 [0-9.]+ ms plan={first['id']} cached=false request={mine}", lines[0])
    assert re.fullmatch(rf"POST /plan 200 [0-9.]+ ms plan={first['id']} cached=true request=lb-1234.5", lines[1])
    assert re.fullmatch(rf"GET /healthz 200 [0-9.]+ ms request={health.headers['x-request-id']}", lines[2])


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_path_with_control_characters_is_one_escaped_line(tmp_path: Path, caplog, log_format: str) -> None:
    """`%0A` in a path would start a second, forged line; `%00` write a raw NUL."""
    c = TestClient(create_app(Settings(db_path=tmp_path / "plans.db", log_format=log_format)))
    forged = "x%0A2026-11-27 POST /plan 200 1.0 ms plan=forged cached=false%00%1B[31m"
    with caplog.at_level(logging.INFO, logger="spmd_planner.api"):
        assert c.get(f"/plans/{forged}").status_code == 404
    lines = [r.getMessage() for r in caplog.records if r.name == "spmd_planner.api"]
    assert len(lines) == 1 and "\n" not in lines[0] and "\x00" not in lines[0] and "\x1b" not in lines[0]
    decoded = "/plans/x\n2026-11-27 POST /plan 200 1.0 ms plan=forged cached=false\x00\x1b[31m"
    if log_format == "json":
        record = json.loads(lines[0])
        assert record["path"] == decoded and record["status"] == 404 and record["method"] == "GET"
    else:
        assert lines[0].startswith("GET /plans/x\\n2026-11-27 POST /plan 200 1.0 ms plan=forged cached=false")
        assert "\\x00\\x1b[31m 404 " in lines[0]


def test_plan_ids_include_the_planner_version(monkeypatch) -> None:
    request = PlanRequest(hlo=DEFAULT_DUMP.read_text(), chip="v6e")
    today = request.content_hash()
    monkeypatch.setattr("planner.wire.planner_version", lambda: planner_version() + "-changed")
    assert request.content_hash() != today


def test_another_planner_version_misses_the_stored_plan(tmp_path: Path, monkeypatch) -> None:
    c = client(tmp_path)
    body = {"hlo": SMALL_HLO, "mesh": {"shape": [4, 2], "axis_names": ["fsdp", "tp"]}}
    first = c.post("/plan", json=body).json()
    assert c.post("/plan", json=body).json()["cached"] is True
    monkeypatch.setattr("planner.wire.planner_version", lambda: planner_version() + "-changed")
    changed = c.post("/plan", json=body).json()
    assert changed["cached"] is False and changed["id"] != first["id"]


@pytest.mark.parametrize(
    ("mesh", "warnings"),
    [
        ({"shape": [4, 2], "axis_names": ["fsdp", "tp"]}, []),
        (
            {"shape": [2, 4], "axis_names": ["tp", "fsdp"]},
            [
                "mesh tp=2,fsdp=4 does not fit the module's parameter shardings; fsdp=4,tp=2 or tp=4,fsdp=2 "
                "would: check the axis order (major to minor) and sizes"
            ],
        ),
    ],
    ids=["fsdp4_tp2", "swapped_tp2_fsdp4"],
)
def test_the_plan_response_warns_about_a_swapped_mesh(tmp_path: Path, mesh: dict, warnings: list[str]) -> None:
    response = client(tmp_path).post("/plan", json={"hlo": SMALL_HLO, "mesh": mesh})
    assert response.status_code == 200, response.text
    assert response.json()["plan"]["warnings"] == warnings


def test_a_server_keeps_warm_planner_processes_and_stops_them(tmp_path: Path) -> None:
    """Started with the server, handed one job each, replaced behind it, stopped with the server."""
    app = create_app(Settings(db_path=tmp_path / "plans.db", max_workers=2))
    workers = app.state.workers
    body = {"hlo": DEFAULT_DUMP.read_text(), "mesh": {"shape": [4, 2], "axis_names": ["fsdp", "tp"]}}
    with TestClient(app) as c:
        waiting = list(workers._spares)
        assert len(waiting) == 2 and all(p.returncode is None for p in waiting)
        assert c.post("/plan", json=body).status_code == 200
        # The job went to the first spare, which is gone; two spares wait again.
        assert waiting[0] not in workers._spares and waiting[1] in workers._spares
        assert len(workers._spares) == 2
        kept = list(workers._spares)
    assert all(p.returncode is not None for p in kept)

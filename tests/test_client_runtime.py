"""The client runtime: auto_plan on real torch_xla SPMD, through the service and in-process; its failure modes.

The torch_xla runs happen in subprocesses (`xla_client_driver.py`): SPMD on 8
virtual CPU devices is set up once per process by environment variables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import CORPUS, REPO
from live_server import free_port, live_server

from planner.mesh import Mesh
from planner.plan.model import Plan
from scan_runtime import LayerPlan, PlanMismatch, PlannerClient, PlannerRefused, PlannerUnavailable

DRIVER = REPO / "tests" / "xla_client_driver.py"


def drive(mode: str, cache: Path, url: str | None = None) -> dict:
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "8"}
    command = [sys.executable, str(DRIVER), mode, "--cache", str(cache), *(["--url", url] if url else [])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line.removeprefix("RESULT "))  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return drive("mismatch", tmp_path_factory.mktemp("cache"))


@pytest.mark.xla
def test_auto_plan_leaves_no_gradient_sharded_unlike_its_weight(embedded: dict) -> None:
    # torch_xla 2.9 alone: o and d projections and both norms of every layer come out sharded unlike their weights.
    assert len(embedded["before"]) == 16
    assert {name.split(".", 2)[2] for name in embedded["before"]} == {"o.weight", "d.weight", "n1.weight", "n2.weight"}
    assert embedded["pins"]["d.weight"] == ["fsdp", "tp"] and embedded["pins"]["q.weight"] == ["tp", "fsdp"]
    assert embedded["after"] == []


@pytest.mark.xla
def test_the_service_gives_the_same_plan(embedded: dict, tmp_path: Path) -> None:
    with live_server(tmp_path / "plans.sqlite3") as url:
        remote = drive("mismatch", tmp_path / "cache", url)
    assert remote["plan"] == embedded["plan"]
    assert remote["pins"] == embedded["pins"] and remote["after"] == []


@pytest.mark.xla
def test_numerics_are_unchanged_by_the_plan(tmp_path: Path) -> None:
    losses = drive("losses", tmp_path / "cache")
    assert len(losses["with"]) == len(losses["without"]) == 3
    for plain, planned in zip(losses["without"], losses["with"]):
        assert planned == pytest.approx(plain, rel=1e-5)
    assert losses["without"][2] < losses["without"][0]  # it trained


@pytest.mark.xla
def test_without_a_plan_scan_layers_is_torch_xlas(tmp_path: Path) -> None:
    plain = drive("plain", tmp_path / "cache")
    assert plain["ours"] == plain["torch_xla"]


@pytest.mark.xla
def test_the_example_trains_with_a_plan(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, str(REPO / "examples" / "train_llama_scan.py"), "--steps", "2"],
                          capture_output=True, text=True, timeout=900, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # The step runs on XLA:CPU and the example plans its whole SGD step for it (a 32 GiB budget), verdict first.
    # SGD's update reads each gradient beside its weight, so none comes out sharded unlike it and no pin pays.
    assert "  verdict: fits: 29.7 MiB per chip after the plan, 32.0 GiB to spare on 32.0 GiB; before 29.7 MiB" in (
        done.stdout
    )
    assert "HBM per chip: 29.7 MiB -> 29.7 MiB of 32.0 GiB" in done.stdout
    assert ("pinned inside the scanned layer: nothing (no change: no placement torch_xla can apply lowers HBM per "
            "chip)") in done.stdout  # fmt: skip
    assert done.stdout.count("gradients sharded unlike their weights: 0") == 2
    # Findings by the parameter they belong to; no libtpu probing for a TPU before the output.
    assert "  [large-buffer] derived from layers.d.weight, kept per layer for the backward f32[4,1024,256]" in (
        done.stdout
    )
    assert "TPU" not in done.stderr, done.stderr


@pytest.mark.xla
def test_the_example_trains_plain_when_the_service_is_unreachable(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = subprocess.run([sys.executable, str(REPO / "examples" / "train_llama_scan.py"), "--steps", "1", "--url", url],
                          capture_output=True, text=True, timeout=900, env=env)  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stdout.startswith(f"no plan (cannot reach the planner service at {url} after 3 attempts")
    assert "step 0: loss" in done.stdout


SMALL = (CORPUS / "torch_xla" / "llama_scan_L4_small.hlo").read_text()


def test_in_process_plans_are_cached_on_disk(tmp_path: Path) -> None:
    client = PlannerClient(mesh=Mesh.parse("fsdp=4,tp=2"), chip="v6e", cache_dir=tmp_path)
    first = client.plan(SMALL)
    again = client.plan(SMALL)
    assert first is not None and again is not None
    assert (first.source, again.source) == ("in-process", "disk cache")
    assert again.plan == first.plan and again.plan_id == first.plan_id
    assert [p.name for p in tmp_path.iterdir()] == [f"{first.plan_id}.json"]


def test_the_printed_plan_id_opens_on_the_service_and_each_run_asks_it(tmp_path: Path) -> None:
    mesh = Mesh.parse("fsdp=4,tp=2")
    local = PlannerClient(mesh=mesh, chip="v6e", cache_dir=tmp_path / "local").plan(SMALL)
    with live_server(tmp_path / "plans.sqlite3") as url:
        client = PlannerClient(url=url, mesh=mesh, chip="v6e", cache_dir=tmp_path / "cache")
        first, again = client.plan(SMALL), client.plan(SMALL)
        assert first is not None and again is not None and local is not None
        # One recipe: the id the client prints is the service's, and an in-process plan's too.
        assert first.plan_id == again.plan_id == local.plan_id
        with urllib.request.urlopen(f"{url}/plans/{first.plan_id}", timeout=30) as r:
            assert json.loads(r.read())["id"] == first.plan_id
        # A run with a URL asks the service every time; the service says it held the plan.
        assert (first.source, again.source) == ("service", "service (stored)")
    # The service gone, the disk copy answers, and says so.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        offline = PlannerClient(url=url, mesh=mesh, chip="v6e", retries=0, timeout=5, cache_dir=tmp_path / "cache")
        kept = offline.plan(SMALL)
    assert kept is not None and kept.source == "disk cache" and kept.plan == first.plan
    assert any(f"using the plan {first.plan_id} kept on disk" in str(w.message) for w in caught)


def test_unreachable_service_strict_and_lenient(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    strict = PlannerClient(url=url, mesh=Mesh.parse("fsdp=4,tp=2"), retries=1, timeout=5, cache_dir=tmp_path)
    with pytest.raises(PlannerUnavailable, match=rf"cannot reach the planner service at {url} after 2 attempts"):
        strict.plan(SMALL)
    lenient = PlannerClient(url=url, retries=0, timeout=5, strict=False, cache_dir=tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert lenient.plan(SMALL) is None
    assert any("training on without a plan" in str(w.message) for w in caught)


def test_service_refusal_names_the_reason(tmp_path: Path) -> None:
    with live_server(tmp_path / "plans.sqlite3") as url:
        client = PlannerClient(url=url, mesh=Mesh.parse("fsdp=2,tp=2"), cache_dir=tmp_path / "cache")
        with pytest.raises(
            PlannerRefused, match="422: mesh fsdp=2,tp=2 has 4 devices but the module has num_partitions=8"
        ):
            client.plan((CORPUS / "torch_xla" / "llama_scan_L8_fsdp4_tp2.hlo").read_text())


def _plan_with_pins() -> Plan:
    cached = Path(__file__).resolve().parents[1] / "api" / "examples" / "plan.json"
    plan = Plan.model_validate_json(cached.read_text())
    from planner.plan.model import TorchPinInfo

    for p in plan.placements:
        p.recommended = True
        p.torch = TorchPinInfo(
            parameter="d.weight", partition_spec=["fsdp", "tp"], shape=[1024, 4096], call="mark_sharding_with_gradients"
        )
        # The spec a plan shows the user is the one the client applies: the same pin in the user's words.
        if p.user is not None:
            p.user = p.user.model_copy(update={"parameter": "d.weight", "partition_spec": ["fsdp", "tp"]})
    return plan


def test_plans_that_do_not_fit_are_refused_with_the_mismatch() -> None:
    mesh = SimpleNamespace(axis_names=("fsdp", "tp"), mesh_shape=(4, 2))
    plan = _plan_with_pins()
    layer_plan = LayerPlan.from_plan(plan, mesh)
    assert layer_plan.pins == {"d.weight": ("fsdp", "tp")}
    with pytest.raises(PlanMismatch, match=r"the plan pins \['d.weight'\], which the scanned layer does not have"):
        layer_plan.check_parameters({"q.weight": (1024, 1024)})
    shape_message = (
        r"made for d.weight of shape \(1024, 4096\), but the scanned layer's d.weight has shape \(256, 1024\)"
    )
    with pytest.raises(PlanMismatch, match=shape_message):
        layer_plan.check_parameters({"d.weight": (256, 1024)})
    unshaped = LayerPlan(layer_plan.pins, mesh)
    rank_message = r"pins d.weight with partition spec \('fsdp', 'tp'\), but d.weight has shape \(4096,\)"
    with pytest.raises(PlanMismatch, match=rank_message):
        unshaped.check_parameters({"d.weight": (4096,)})
    with pytest.raises(PlanMismatch, match="the plan is for mesh fsdp=4,tp=2, the model runs on fsdp=8,tp=1"):
        LayerPlan.from_plan(plan, SimpleNamespace(axis_names=("fsdp", "tp"), mesh_shape=(8, 1)))
    with pytest.raises(PlanMismatch, match=r"not axes of the mesh \('data', 'model'\)"):
        LayerPlan.from_plan(
            plan.model_copy(update={"mesh": None}), SimpleNamespace(axis_names=("data", "model"), mesh_shape=(4, 2))
        )
    hlo_only = Plan.model_validate_json(
        (Path(__file__).resolve().parents[1] / "api" / "examples" / "plan.json").read_text()
    )
    with pytest.raises(PlanMismatch, match="made without a manifest"):
        LayerPlan.from_plan(hlo_only, mesh)

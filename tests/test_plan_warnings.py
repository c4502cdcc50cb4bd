"""The plan says what the planner cannot help with, and the next step: a module with no sharding, a step
with no scanned layers, a mesh that does not fit the module's shardings. Steps it can help with plan quietly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CORPUS, REPO

from planner import parse_hlo_file
from planner.data import DEFAULT_DUMP
from planner.mesh import Mesh
from planner.mesh_check import mesh_warnings
from planner.plan.diagnosis.plan_warnings import plan_warnings
from planner.plan.planner import make_plan
from planner.prepare import prepare

FIXTURES = REPO / "tests" / "fixtures" / "plan_warnings"
NO_ANNOTATIONS = "the module carries no sharding annotations"
NO_LOOP = "no While loop in the module"


def _plan_warnings(path: Path, mesh: str | None = None) -> list[str]:
    plan, _ = make_plan(prepare(parse_hlo_file(path), mesh=Mesh.parse(mesh) if mesh else None))
    return plan.warnings


def test_a_module_with_no_sharding_says_so_and_how_to_shard_it() -> None:
    (warning,) = _plan_warnings(FIXTURES / "no_annotations.hlo")
    assert warning.startswith(NO_ANNOTATIONS) and "whole on each of the 8 devices" in warning
    assert "mark_sharding" in warning and "in_shardings" in warning and "with_sharding_constraint" in warning


def test_a_step_with_no_loop_says_the_planner_looks_for_scanned_layers() -> None:
    (warning,) = _plan_warnings(FIXTURES / "no_loop.hlo")
    assert warning.startswith(NO_LOOP) and "found none" in warning
    assert "still predicts HBM per chip" in warning
    assert "jax.lax.scan" in warning and "scan_layers" in warning


def test_a_mesh_the_shardings_do_not_fit_is_named_with_the_one_they_imply() -> None:
    warnings = _plan_warnings(DEFAULT_DUMP, "fsdp=8")
    assert warnings == [
        "mesh fsdp=8 does not fit the module's parameter shardings: they split the 8 devices 4 x 2 (major to "
        "minor), as mesh fsdp=4,tp=2 does; pass that --mesh (naming its axes as the step does) or shard the step "
        "for the mesh you meant"
    ]


@pytest.mark.parametrize(
    ("mesh", "implied"),
    [("fsdp=8", "fsdp=4,tp=2"), ("data=2,fsdp=2,tp=2", None), ("fsdp=4,tp=2", None), ("x=2,y=4", "x=4,y=2")],
    ids=["one_axis", "three_axes_fit", "fits", "sizes_exchanged"],
)
def test_the_implied_mesh_is_suggested_only_when_no_reordering_fits(mesh: str, implied: str | None) -> None:
    warnings = mesh_warnings(parse_hlo_file(DEFAULT_DUMP), Mesh.parse(mesh))
    if implied is None:
        assert warnings == []
    else:
        (warning,) = warnings
        assert f"mesh {mesh} does not fit" in warning and implied in warning


def test_the_cli_prints_each_warning() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "planner", "plan", str(FIXTURES / "no_annotations.hlo")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"spmd-planner: warning: {NO_ANNOTATIONS}" in done.stderr


def test_the_bundled_dump_on_its_mesh_plans_without_a_warning() -> None:
    assert _plan_warnings(DEFAULT_DUMP, "fsdp=4,tp=2") == []


CORPUS_STEPS = sorted(CORPUS.glob("*/*.hlo"))


@pytest.mark.parametrize("path", CORPUS_STEPS, ids=[p.name.removesuffix(".hlo") for p in CORPUS_STEPS])
def test_corpus_steps_warn_only_of_a_missing_loop(path: Path) -> None:
    """Every corpus step is sharded; only the plain-loop step (its layers unrolled) has no While."""
    warnings = plan_warnings(prepare(parse_hlo_file(path)))
    unrolled = "_loop_" in path.name
    assert [w[: len(NO_LOOP)] for w in warnings] == ([NO_LOOP] if unrolled else [])


def test_a_module_with_no_layers_is_not_told_to_scan_them() -> None:
    """No dot, no layers: the advice to scan them does not apply (the service's smallest request)."""
    assert _plan_warnings(FIXTURES / "no_layers.hlo", "fsdp=4,tp=2") == []

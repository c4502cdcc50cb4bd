"""A mesh that does not fit the module's shardings is named, with the ones that would; right meshes pass quietly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CORPUS

from planner.hlo.text.parser import parse_hlo_file
from planner.mesh import Mesh
from planner.mesh_check import mesh_warnings

TRUTHS = sorted(CORPUS.glob("torch_xla/*.truth.json")) + sorted(CORPUS.glob("jax/*.xla.json"))


def _case(path: Path) -> tuple[Mesh, Path]:
    m = json.loads(path.read_text())["mesh"]
    mesh = Mesh(tuple(m["shape"]), tuple(m["axis_names"]), tuple(m.get("device_ids") or ()))
    return mesh, path.with_name(path.name.split(".")[0] + ".hlo")


@pytest.mark.parametrize("truth", TRUTHS, ids=[p.name.split(".")[0] for p in TRUTHS])
def test_the_true_mesh_gives_no_warning_and_its_reversal_does(truth: Path) -> None:
    mesh, hlo = _case(truth)
    module = parse_hlo_file(hlo)
    assert mesh_warnings(module, mesh) == []
    reversed_mesh = Mesh(tuple(reversed(mesh.shape)), tuple(reversed(mesh.axis_names)), mesh.device_ids)
    warnings = mesh_warnings(module, reversed_mesh)
    if 1 in mesh.shape:  # a size-1 axis splits nothing: either order fits
        assert warnings == []
    else:
        assert len(warnings) == 1 and f"mesh {reversed_mesh.to_text()} does not fit" in warnings[0]
        assert mesh.to_text() in warnings[0]


def test_exchanged_sizes_are_named_with_every_mesh_that_fits() -> None:
    module = parse_hlo_file(CORPUS / "jax" / "jax_llama_scan_L8_fsdp4_tp2.hlo")
    assert mesh_warnings(module, Mesh.parse("fsdp=2,tp=4")) == [
        "mesh fsdp=2,tp=4 does not fit the module's parameter shardings; tp=4,fsdp=2 or fsdp=4,tp=2 would: "
        "check the axis order (major to minor) and sizes"
    ]

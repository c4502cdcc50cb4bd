"""Placements in the user's words: the parameter's name, a PartitionSpec over the mesh's axis names and a line
to paste, checked against what the framework that wrote each corpus step says its parameters are."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import CORPUS
from test_manifest import _llama_manifest

from cli.plan_command import render_plan
from planner import parse_hlo_file
from planner.mesh import Mesh
from planner.plan.fixes.placements import PIN_OUTPUT, PIN_PARAMETER
from planner.plan.model import Plan
from planner.plan.planner import make_plan
from planner.prepare import prepare

MESH = Mesh.parse("fsdp=4,tp=2")
JAX_STEP = CORPUS / "jax" / "jax_llama_scan_L8_fsdp4_tp2"
TORCH_STEP = CORPUS / "torch_xla" / "llama_scan_L8_fsdp4_tp2"


def _jax_plan() -> Plan:
    plan, _ = make_plan(prepare(parse_hlo_file(JAX_STEP.with_suffix(".hlo")), mesh=MESH))
    return plan


def test_a_jax_step_s_pins_name_each_parameter_with_the_spec_jax_gave_it() -> None:
    plan = _jax_plan()
    params = json.loads(JAX_STEP.with_suffix(".xla.json").read_text())["params"]
    pins = [p for p in plan.placements if p.kind == PIN_PARAMETER]
    assert len(pins) == 9
    checked = 0
    for p in pins:
        assert p.user is not None and p.user.framework == "jax"
        assert p.user.parameter in params, p.user.parameter
        stacked = params[p.user.parameter]["partition_spec"]
        if any(a is not None for a in stacked):
            # One layer's slice: the stacked parameter's spec without its layer dim.
            assert p.user.partition_spec == stacked[1:], p.user.parameter
            checked += 1
    assert checked == 7
    (down,) = [p for p in pins if p.user is not None and p.user.parameter == "params['w_down']"]
    assert down.user is not None
    assert down.user.code == "w_down = jax.lax.with_sharding_constraint(w_down, NamedSharding(mesh, P('tp', 'fsdp')))"
    assert down.user.summary == "pin params['w_down'] and its gradient to P('tp', 'fsdp') in the scanned layer"
    assert "lax.scan" in down.user.where


def test_the_cli_prints_the_framework_line_with_the_hlo_as_detail() -> None:
    text = render_plan(_jax_plan())
    assert (
        "    [in the change set] pin params['w_down'] and its gradient to P('tp', 'fsdp') in the scanned layer" in text
    )
    assert "      jax: w_down = jax.lax.with_sharding_constraint(w_down, NamedSharding(mesh, P('tp', 'fsdp')))" in text
    assert (
        "      hlo: pin while.44[30] and its gradient to {devices=[1,2,4]<=[4,2]T(1,0)} inside the scanned body" in text
    )


def test_a_change_set_of_several_placements_prints_one_per_line() -> None:
    plan = _jax_plan()
    # The same placements, recommended one by one rather than as "pin every scanned parameter".
    for alternative in plan.alternatives:
        alternative.recommended = False
    assert plan.verdict is not None
    chosen = [p for p in plan.placements if p.id in plan.verdict.change_set]
    assert len(chosen) == 9
    lines = render_plan(plan).splitlines()
    assert "  recommended: 9 placements; saves" in next(line for line in lines if line.startswith("  recommended:"))
    start = next(i for i, line in enumerate(lines) if line.startswith("  recommended:")) + 1
    assert lines[start : start + 9] == [f"    {p.user.summary}" for p in chosen if p.user is not None]


def test_the_client_logs_each_placement_it_applies_as_the_user_would_write_it() -> None:
    from scan_runtime.auto import plan_lines
    from scan_runtime.client import PlanResult

    lines = plan_lines(PlanResult(_jax_plan(), "abc", "in-process"))
    assert (
        "  pin params['w_down'] and its gradient to P('tp', 'fsdp') in the scanned layer: "
        "w_down = jax.lax.with_sharding_constraint(w_down, NamedSharding(mesh, P('tp', 'fsdp')))"
    ) in lines
    assert len([line for line in lines if line.startswith("  pin ")]) == 9


def test_a_torch_xla_step_s_pins_derive_the_spec_torch_xla_was_given() -> None:
    """With a manifest, the spec shown is derived from the pin's sharding, not copied from the manifest: it
    equals the spec the user gave each weight (truth.json's param_partition_specs)."""
    truth = json.loads(TORCH_STEP.with_suffix(".truth.json").read_text())
    plan, _ = make_plan(
        prepare(parse_hlo_file(TORCH_STEP.with_suffix(".captured.hlo")), mesh=MESH), manifest=_llama_manifest(truth)
    )
    pins = {p.user.parameter: p.user for p in plan.placements if p.recommended and p.user is not None}
    for name in ("q", "k", "v", "o", "g", "u", "d"):
        user = pins[f"{name}.weight"]
        assert user.framework == "torch_xla"
        assert user.partition_spec == truth["param_partition_specs"][f"0.{name}.weight"], name
    assert pins["d.weight"].code == "d_weight = xs.mark_sharding_with_gradients(layer.d.weight, mesh, ('fsdp', 'tp'))"


def test_a_torch_xla_dump_without_names_still_gets_a_spec_and_says_what_it_pins() -> None:
    plan, _ = make_plan(prepare(parse_hlo_file(TORCH_STEP.with_suffix(".hlo")), mesh=MESH))
    pins = [p for p in plan.placements if p.kind == PIN_PARAMETER]
    assert pins
    for p in pins:
        assert p.user is not None and p.user.parameter is None
        assert p.user.partition_spec is not None
        # The parameter by where the forward loop carries it, not by its gradient's place.
        assert " parameter at while.953[" in p.user.summary and p.fixes[0] not in p.user.summary
        # No line names a weight the dump does not name: the plan says so, and how to get one.
        assert p.user.code is None and p.user.missing is not None and "manifest" in p.user.missing
        assert "(the dump names none)" in p.user.where
    # Each pin tells its weight apart from the others: by where the forward loop carries it.
    assert len({p.user.summary for p in pins if p.user is not None}) == len(pins)


def test_without_a_mesh_there_is_no_spec_and_the_plan_says_how_to_get_one() -> None:
    plan, _ = make_plan(prepare(parse_hlo_file(JAX_STEP.with_suffix(".hlo"))))
    pins = [p for p in plan.placements if p.kind == PIN_PARAMETER]
    assert pins
    for p in pins:
        assert p.user is not None and p.user.code is None and p.user.partition_spec is None
        assert p.user.missing is not None and "--mesh" in p.user.missing
        assert p.user.parameter is not None and p.user.parameter.startswith("params[")


@pytest.mark.xla
def test_a_returned_gradient_s_pin_reads_as_the_gradient_in_the_grads_tree() -> None:
    from fidelity.cases import CI_SUBSET
    from fidelity.references import ensure_references, reference_path

    step = next(
        c for c in CI_SUBSET if c.front_end == "jax" and c.step == "lm" and c.partitioner == "gspmd" and not c.pinned
    )
    assert not ensure_references([step])
    plan, _ = make_plan(prepare(parse_hlo_file(reference_path(step)), mesh=MESH))
    (output,) = [p for p in plan.placements if p.kind == PIN_OUTPUT]
    assert output.user is not None
    assert output.user.parameter == "params['embed']"
    assert output.user.code == (
        "grads['embed'] = jax.lax.with_sharding_constraint(grads['embed'], NamedSharding(mesh, P('tp', 'fsdp')))"
    )


LLAMA_405B = Path(__file__).parent / "fixtures" / "generated" / "jax_llama405b_remat_L126_fsdp64_tp4.hlo"


@pytest.mark.parametrize(
    "path,mesh",
    [(JAX_STEP.with_suffix(".hlo"), "fsdp=4,tp=2"), (LLAMA_405B, "fsdp=64,tp=4")],
    ids=["jax_8_chips", "jax_405b_256_chips"],
)
def test_where_the_step_names_its_parameters_every_gradient_and_pin_is_named(path: Path, mesh: str) -> None:
    """JAX steps carry each parameter's path in its metadata: every stacked gradient found and every pin
    is named by it."""
    plan, _ = make_plan(prepare(parse_hlo_file(path), mesh=Mesh.parse(mesh)))
    gradients = [f for f in plan.findings if f.kind == "stacked-gradient"]
    assert len(gradients) == 7
    assert all(f.name is not None and re.fullmatch(r"grad of params\['\w+'\]", f.name) for f in gradients)
    pins = [p for p in plan.placements if p.kind == PIN_PARAMETER]
    assert pins and all(p.user is not None and (p.user.parameter or "").startswith("params['") for p in pins)
    # Each gradient's pin names the same parameter as the finding.
    pinned = {p.user.parameter for p in pins if p.user is not None}
    assert {f.name.removeprefix("grad of ") for f in gradients if f.name} <= pinned

"""The plan end to end: findings fixed by the placements, checked by re-simulation and by real XLA."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CORPUS

from planner import parse_hlo, parse_hlo_file, print_module
from planner.hlo.ir.shapes import parse_shape
from planner.mesh import Mesh
from planner.plan.diagnosis.findings import buffer_findings
from planner.plan.diagnosis.scan_pairs import stacked_gradients
from planner.plan.fixes.placements import apply_placements, pin_parameter
from planner.plan.planner import IDLE_WHY, PIN_EVERY_PARAMETER, make_plan, per_device_while_shapes, simulate
from planner.prepare import prepare, reprepare
from planner.propagation import propagate
from planner.scanner import Cursor

MESH = Mesh.parse("fsdp=4,tp=2")
CASES = [
    "torch_xla/llama_scan_L8_fsdp4_tp2",
    "torch_xla/llama_scan_L8_fsdp4_tp2_noshardas",
    "jax/jax_llama_scan_L8_fsdp4_tp2",
]


@pytest.fixture(scope="module")
def plans() -> dict[str, tuple]:
    return {case: make_plan(prepare(parse_hlo_file(CORPUS / f"{case}.hlo"), mesh=MESH)) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c.split("/")[1] for c in CASES])
def test_recommended_placements_fix_every_stacked_gradient(plans: dict, case: str) -> None:
    plan, patched = plans[case]
    gradients = [f for f in plan.findings if f.kind == "stacked-gradient"]
    assert gradients
    recommended = [p for p in plan.placements if p.recommended]
    fixed = {key for p in recommended for key in p.fixes}
    assert {f"{f.loop}[{f.index}]" for f in gradients} <= fixed
    # Each finding is at its ideal once the plan is applied.
    assert all(f.per_device_bytes_after == f.ideal_per_device_bytes for f in gradients)
    # The patched module is valid HLO, and re-propagated it has no stacked-gradient finding left.
    reread = parse_hlo(print_module(patched))
    left = [f for f in buffer_findings(reread, propagate(prepare(reread)), 8) if f.kind == "stacked-gradient"]
    assert left == []
    waste = sum(f.waste_bytes for f in gradients)
    # Pinning frees the accumulators' waste but adds the partial sums a pinned gradient is reduced
    # from: XLA's compile of the JAX case saves exactly the waste (192.0 MiB), and the predicted
    # saving stays within 8% of it (177.2 MiB there).
    assert plan.hbm.total_before - plan.hbm.total_after >= 0.92 * waste


@pytest.mark.parametrize("case", CASES, ids=[c.split("/")[1] for c in CASES])
def test_no_recommended_placement_costs_memory(plans: dict, case: str) -> None:
    plan, _ = plans[case]
    assert plan.hbm.total_after < plan.hbm.total_before
    for p in plan.placements:
        if p.predicted_total_alone is not None and p.predicted_total_alone >= plan.hbm.total_before:
            # Alone it costs memory: recommended only as part of a set that predicts less.
            assert not p.recommended or "together" in p.why, p
        assert "MiB" in p.why  # the reason is given in predicted bytes
    for alt in plan.alternatives:
        if alt.recommended:
            assert alt.predicted_total == plan.hbm.total_after < plan.hbm.total_before
        else:
            assert alt.predicted_total >= plan.hbm.total_after


def test_splitting_the_conflicting_shard_group_is_evaluated_and_refused() -> None:
    """Splitting torch_xla's shared group 1 predicts more memory than leaving it: said, not recommended."""
    plan, _ = make_plan(prepare(parse_hlo_file(CORPUS / "torch_xla" / "llama_scan_L8_fsdp4_tp2.hlo"), mesh=MESH))
    (split,) = [p for p in plan.placements if p.kind == "split-shard-group"]
    assert split.fixes == ["shard_as group 1"]
    assert len(split.shard_as_pairs) == 4 and all(len(pair) == 2 for pair in split.shard_as_pairs)
    assert split.predicted_total_alone is not None and split.predicted_total_alone > plan.hbm.total_before
    assert not split.recommended


FIXED_PAIRS = [
    (path.name.removesuffix("_fixed.truth.json"), path) for path in sorted(CORPUS.glob("torch_xla/*_fixed.truth.json"))
]


@pytest.mark.parametrize("base,fixed_truth", FIXED_PAIRS, ids=[b for b, _ in FIXED_PAIRS])
def test_pinning_every_parameter_predicts_what_the_fixed_run_measured(base: str, fixed_truth: Path) -> None:
    """Re-simulate X with X_fixed's placement: XLA's While shapes for X_fixed, and its bytes within 5%."""
    raw = parse_hlo_file(CORPUS / "torch_xla" / f"{base}.hlo")
    truth = json.loads(fixed_truth.read_text())
    mesh = Mesh(tuple(truth["mesh"]["shape"]), tuple(truth["mesh"]["axis_names"]))
    plan, _ = make_plan(prepare(raw, mesh=mesh))
    prepared = prepare(raw, mesh=mesh)
    before = simulate(prepared, None)
    gradients = stacked_gradients(prepared.module, before.result)
    every = [p for g in gradients if (p := pin_parameter(prepared.module, g)) is not None]
    assert len(every) == len(gradients) > 0
    after = simulate(reprepare(prepared, apply_placements(prepared.front, every)), None)

    ours = per_device_while_shapes(after)
    for xla in truth["xla_post_partition_while_shapes"]:
        xla_dims = [leaf.dims for leaf in parse_shape(Cursor(xla["shape"]), {}).leaves()]
        (name,) = [n for n, text in ours.items() if len(parse_shape(Cursor(text), {}).leaves()) == len(xla_dims)]
        assert [leaf.dims for leaf in parse_shape(Cursor(ours[name]), {}).leaves()] == xla_dims, name
    measured = truth["xla_per_device_total_bytes"]
    assert abs(after.total - measured) <= 0.05 * measured, f"predicted {after.total:,} vs XLA {measured:,}"
    # The plan reports the same set as its alternative, with the same number, and says whether it pays.
    (alt,) = [a for a in plan.alternatives if a.name == PIN_EVERY_PARAMETER] or [None]
    if alt is not None:
        assert alt.predicted_total == after.total
        assert alt.recommended == (after.total == plan.hbm.total_after < plan.hbm.total_before)
        if after.total > plan.hbm.total_before:
            assert "costs memory" in alt.why
        elif after.total == plan.hbm.total_before:
            assert alt.why == IDLE_WHY or alt.why.startswith("saves nothing")


CONTROLS = [
    "torch_xla/llama_scan_L8_fsdp4_tp2_fixed",
    "jax/jax_llama_scan_L8_fsdp4_tp2_pinned",
    "torch_xla/llama_scan_L8_fsdp8",
]


@pytest.mark.parametrize("case", CONTROLS, ids=[c.split("/")[1] for c in CONTROLS])
def test_controls_get_no_gradient_finding_and_no_placement_that_costs_memory(case: str) -> None:
    raw = parse_hlo_file(CORPUS / f"{case}.hlo")
    mesh = MESH if "fsdp8" not in case else Mesh.parse("fsdp=8,tp=1")
    plan, _ = make_plan(prepare(raw, mesh=mesh))
    assert [f for f in plan.findings if f.kind == "stacked-gradient"] == []
    assert plan.hbm.total_after <= plan.hbm.total_before
    for alt in plan.alternatives:
        if alt.predicted_total > plan.hbm.total_before:
            assert not alt.recommended and "costs memory" in alt.why
        elif alt.predicted_total == plan.hbm.total_before:
            assert not alt.recommended and (alt.why == IDLE_WHY or alt.why.startswith("saves nothing"))


def test_mesh_that_does_not_fit_the_module_is_refused() -> None:
    with pytest.raises(ValueError, match=r"mesh fsdp=2,tp=2 has 4 devices but the module has num_partitions=8"):
        make_plan(
            prepare(parse_hlo_file(CORPUS / "jax" / "jax_llama_scan_L8_fsdp4_tp2.hlo"), mesh=Mesh.parse("fsdp=2,tp=2"))
        )


@pytest.mark.xla
def test_verify_mode_confirms_the_jax_plan_with_real_xla() -> None:
    """jaxlib's SPMD compile of the original and the patched module: gradients at their shard, memory drops."""
    plan, _ = make_plan(
        prepare(parse_hlo_file(CORPUS / "jax" / "jax_llama_scan_L8_fsdp4_tp2.hlo"), mesh=MESH), verify=True
    )
    v = plan.verification
    assert v is not None
    assert v.xla.startswith("jaxlib 0.7.1")
    assert v.stacked_gradients_at_shard, v.gradient_mismatches
    assert v.xla_saving_bytes > 0
    # XLA:CPU, the compiler the plan is for, backs the claim, and its bytes decide the verdict.
    assert v.confirmed is True and plan.withdrawn is None
    assert plan.verdict is not None and plan.verdict.measured_by == "XLA:CPU"
    assert plan.verdict.worst_after_bytes == v.after_total_bytes
    # Measured 1.08: 206.6 MiB predicted against XLA's 192.0 MiB.
    assert 1.0 <= v.predicted_saving_bytes / v.xla_saving_bytes <= 1.1, (v.predicted_saving_bytes, v.xla_saving_bytes)

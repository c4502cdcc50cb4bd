"""The TPU target's pipeline against XLA:TPU itself, on the sweep's CI subset (libtpu, ahead of time).

Each reference holds what XLA:TPU decided for the step: its module as it entered sharding
propagation, every instruction's sharding after its last propagation, each loop's per-device tuple
after `tpu-spmd-partitioning` and the step's output shardings (`fidelity.run_jax`).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from fidelity.agreement import (
    gradient_outputs_found,
    sharding_agreement,
    under_sharded_gradients,
    while_shape_mismatches,
)
from fidelity.cases import CI_SUBSET, Case
from fidelity.placement_check import check_change_set
from fidelity.references import ensure_references, reference_path
from planner import parse_hlo_file
from planner.hlo.structure.loops import while_loops
from planner.mesh import Mesh
from planner.plan.fixes.placements import Annotation, Placement, apply_placements
from planner.plan.planner import make_plan
from planner.prepare import annotate, prepare, reprepare
from planner.propagation import propagate

pytestmark = pytest.mark.xla

TPU_CASES = [c for c in CI_SUBSET if c.front_end == "jax" and c.partitioner == "gspmd" and c.chip is not None]
LM_STEP = next(c for c in TPU_CASES if c.step == "lm" and not c.pinned)


def _reference(case: Case) -> tuple[Path, dict]:
    assert not ensure_references([case]), f"{case.name} failed to generate"
    hlo = reference_path(case)
    return hlo, json.loads(hlo.with_suffix(".xla.json").read_text())


def _mesh(record: dict) -> Mesh:
    return Mesh(tuple(record["mesh"]["shape"]), tuple(record["mesh"]["axis_names"]))


@pytest.mark.parametrize("case", TPU_CASES, ids=[c.name for c in TPU_CASES])
def test_loops_carry_what_xla_tpu_s_loops_carry_when_it_propagates(case: Case) -> None:
    hlo, record = _reference(case)
    prepared = prepare(parse_hlo_file(hlo), case.chip or "v6e")
    golden = parse_hlo_file(hlo.with_name(record["tpu"]["pre_propagation_module"]))

    def carried(loops: object) -> list[Counter[str]]:
        return sorted((Counter(leaf.to_text(False) for leaf in loop.instruction.shape.leaves()) for loop in loops),
                      key=lambda c: sorted(c.items()))  # type: ignore[attr-defined]  # fmt: skip

    assert carried(prepared.loops) == carried(while_loops(golden))


# Instructions matched by name between our prepared module and XLA:TPU's (of 832 to 1,517 in each). Each step
# gained 2 to 10 when algsimp's `transpose(dot(a, b)) -> dot(b, a)` was modelled: the weight-gradient dots it
# rebuilds now pair with XLA:TPU's by structure, and each agrees.
COMPARED = {
    "jax_llama_noremat_f32_gspmd_fsdp4_tp2_L4_D1024_free": 541,
    "jax_llama_dots_f32_gspmd_data2_fsdp2_tp2_L4_D1024_free": 527,
    "jax_gpt2_noremat_bf16_gspmd_fsdp1_tp8_L4_D768_free": 600,
    "jax_gpt2_dots_bf16_gspmd_fsdp8_tp1_L4_D768_free": 502,
    "jax_mlp_dots_bf16_gspmd_fsdp4_tp2_L4_D2048_pinned": 142,
    "jax_moe_noremat_bf16_gspmd_fsdp4_tp2_L4_D1024_free": 620,
    "jax_moe_full_f32_gspmd_fsdp2_tp4_L4_D1024_free": 501,
    "jax_llama_lm_take_V8192_noremat_f32_gspmd_fsdp4_tp2_L4_D1024_free": 590,
    "jax_llama_lmtied_onehot_V8192_adamwclip_f32master_noremat_bf16_gspmd_fsdp2_tp4_L4_D1024_pinned": 1031,
}


@pytest.mark.parametrize("case", TPU_CASES, ids=[c.name for c in TPU_CASES])
def test_per_device_while_shapes_and_instruction_shardings_are_xla_tpu_s(case: Case) -> None:
    hlo, record = _reference(case)
    tpu = record["tpu"]
    prepared = prepare(parse_hlo_file(hlo), case.chip or "v6e")
    result = propagate(prepared)
    compared, misses = while_shape_mismatches(prepared, tpu["post_partition_while_shapes"], result)
    assert misses == [] and compared > 0
    golden = parse_hlo_file(hlo.with_name(tpu["pre_propagation_module"]))
    agreement = sharding_agreement(prepared, result, tpu["instruction_shardings"], golden)
    # Every instruction XLA:TPU's module entering propagation names as ours does is compared (the others its
    # simplification passes made or renamed), and every one agrees.
    assert agreement.compared == COMPARED[case.name.removeprefix("ci_")]
    assert agreement.share == 1.0, agreement


def test_every_gradient_xla_tpu_leaves_under_sharded_is_a_finding_only_tpu_has() -> None:
    """The free LM step: XLA:TPU keeps its stacked gradients and its embedding and head gradients split over tp
    only, where XLA:CPU shards the stacked ones like their weights. The v6e plan finds each, and says why only
    XLA:TPU does."""
    hlo, record = _reference(LM_STEP)
    module = parse_hlo_file(hlo)
    prepared = prepare(module, "v6e", _mesh(record))
    plan, _ = make_plan(prepared, 32 << 30)
    expected = under_sharded_gradients(record, "tpu")
    assert len(expected) >= 8
    covered = gradient_outputs_found(prepared, plan)
    assert expected <= covered, sorted(expected - covered)
    stacked = [f for f in plan.findings if f.kind == "stacked-gradient"]
    assert stacked and all(f.compiler_only and "XLA:CPU shards this gradient" in f.compiler_only for f in stacked)
    assert all("while-loop-constant-sinking" in (f.compiler_only or "") for f in stacked)
    cpu, _ = make_plan(prepare(module, "cpu", _mesh(record)), 32 << 30)
    assert [f for f in cpu.findings if f.kind == "stacked-gradient"] == []


def test_the_plans_change_set_saves_memory_on_xla_tpu() -> None:
    """The fix for those findings, compiled by libtpu for the step's v6e slice: fewer bytes per chip with it."""
    hlo, record = _reference(LM_STEP)
    module = parse_hlo_file(hlo)
    prepared = prepare(module, "v6e", _mesh(record))
    plan, patched = make_plan(prepared, 32 << 30)
    assert plan.verdict is not None and plan.verdict.change_set
    assert LM_STEP.tpu_topology is not None
    check = check_change_set(module, prepared.front, patched, plan, LM_STEP.mesh.num_devices, LM_STEP.tpu_topology)
    # The module as given compiles to the reference's own HBM per chip (the sweep's measure, XLA:TPU's buffer
    # assignment in memory space 0).
    assert check.xla_as_given == record["tpu"]["hbm_bytes"]
    assert check.confirmed and check.predicted_saving > 0, check


def test_placements_written_after_the_passes_are_placements_written_before() -> None:
    """Annotations commute with XLA:TPU's modelled passes: the plan writes them into the prepared module; running
    the passes again on the annotated front propagates to the same shardings."""
    hlo, record = _reference(LM_STEP)
    prepared = prepare(parse_hlo_file(hlo), "v6e", _mesh(record))
    plan, _ = make_plan(prepared, 32 << 30)
    chosen = [
        Placement(p.id, p.kind, p.summary, tuple(p.fixes), tuple(
            Annotation(a.computation, a.instruction, a.sharding, tuple(a.unspecified_dims), a.shard_as)
            for a in p.annotations))
        for p in plan.placements if p.recommended
    ]  # fmt: skip
    assert chosen
    after = propagate(annotate(prepared, lambda m: apply_placements(m, chosen)))
    again = propagate(reprepare(prepared, apply_placements(prepared.front, chosen)))
    assert after.shardings() == again.shardings()

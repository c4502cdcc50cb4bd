"""Recommendations that hold: nothing recommended where XLA has nothing to save, and a change set the
plan's compiler does not back is withdrawn with the reason."""

from __future__ import annotations

import pytest
from conftest import CORPUS

from fidelity.cases import CI_SUBSET, Case
from fidelity.references import ensure_references, reference_path
from planner import parse_hlo_file
from planner.mesh import Mesh
from planner.plan import planner
from planner.plan.compilers.confirmation import CONFIRMED_SHARE, confirmation, confirms
from planner.plan.fixes.placements import PIN_OUTPUT
from planner.plan.model import TpuVerification, Verification
from planner.plan.planner import IDLE_WHY, UNCLAIMED_OUTPUT_WHY, make_plan
from planner.prepare import prepare

MESH = Mesh.parse("fsdp=4,tp=2")
MIB = 1 << 20


@pytest.mark.parametrize(
    ("predicted", "measured", "confirmed"),
    [
        (100, 100, True),
        (100, 70, True),
        (100, 69, False),  # over-claimed: saves, but less than 70% of the claim
        (100, 0, False),
        (100, -5, False),  # costs memory
        (100, 150, True),  # XLA saves more than claimed
        (0, 0, True),  # nothing claimed, nothing lost
        (0, -1, False),
    ],
    ids=["exact", "at_share", "below_share", "nothing", "costs", "more", "none_claimed", "none_claimed_costs"],
)
def test_a_saving_is_confirmed_by_at_least_seventy_percent_of_it(
    predicted: int, measured: int, confirmed: bool
) -> None:
    assert CONFIRMED_SHARE == 0.7
    assert confirms(predicted, measured) is confirmed


def _verification(cpu: tuple[int, int, int, int], tpu: tuple[int, int, int, int] | None = None) -> Verification:
    """XLA's (before, after) beside ours, per compiler: (xla_before, xla_after, predicted_before, predicted_after)."""
    xb, xa, pb, pa = cpu
    tpu_check = None
    if tpu is not None:
        tb, ta, qb, qa = tpu
        tpu_check = TpuVerification(xla="libtpu", topology="v6e:2x4", given_total_bytes=tb, before_total_bytes=tb,
                                    after_total_bytes=ta, xla_saving_bytes=tb - ta, predicted_before_bytes=qb,
                                    predicted_after_bytes=qa)  # fmt: skip
    return Verification(xla="jaxlib", num_devices=8, given_total_bytes=xb, before_total_bytes=xb, after_total_bytes=xa,
                        predicted_saving_bytes=pb - pa, xla_saving_bytes=xb - xa, predicted_before_bytes=pb,
                        predicted_after_bytes=pa, after_while_shapes=[], stacked_gradients_at_shard=True,
                        gradient_mismatches=[], tpu=tpu_check, seconds=1.0)  # fmt: skip


def test_the_compiler_the_plan_is_for_decides_and_says_why() -> None:
    # XLA:CPU saves 10 of 100 MiB claimed: a CPU plan withdraws, naming both numbers.
    cpu_only = _verification((500 * MIB, 490 * MIB, 500 * MIB, 400 * MIB))
    confirmed, why = confirmation(cpu_only, "cpu")
    assert confirmed is False and why is not None
    assert why.startswith("XLA:CPU does not confirm it: predicted to save 100.0 MiB per chip")
    assert "saves 10.0 MiB, 10% of the claim" in why
    # A TPU plan is judged by XLA:TPU, not by XLA:CPU's numbers.
    both = _verification((500 * MIB, 490 * MIB, 500 * MIB, 400 * MIB), (300 * MIB, 220 * MIB, 310 * MIB, 210 * MIB))
    assert confirmation(both, "tpu") == (True, None)
    costs = _verification((500 * MIB, 400 * MIB, 500 * MIB, 400 * MIB), (300 * MIB, 320 * MIB, 310 * MIB, 210 * MIB))
    confirmed, why = confirmation(costs, "tpu")
    assert confirmed is False and why is not None and "XLA:TPU (v6e:2x4) costs 20.0 MiB" in why
    # Without libtpu XLA:TPU did not compile: nothing is confirmed or withdrawn.
    assert confirmation(cpu_only, "tpu") == (None, None)


def test_a_change_set_xla_does_not_back_is_withdrawn(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan's logic on a verification that saves nothing: every placement withdrawn, the verdict says so."""
    prepared = prepare(parse_hlo_file(CORPUS / "jax" / "jax_llama_scan_L8_fsdp4_tp2.hlo"), mesh=MESH)
    kept, _ = make_plan(prepared, 32 << 30)
    assert kept.verdict is not None and kept.verdict.change_set

    def saves_nothing(original, inlined, patched, gradients, num_devices, predicted, topology=None):
        return _verification((444 * MIB, 444 * MIB, predicted.cpu_before, predicted.cpu_after))

    monkeypatch.setattr(planner, "verify_with_xla", saves_nothing)
    plan, patched = make_plan(prepared, 32 << 30, verify=True)
    assert plan.withdrawn is not None and plan.withdrawn.startswith("XLA:CPU does not confirm it")
    assert not any(p.recommended for p in plan.placements) and not any(a.recommended for a in plan.alternatives)
    assert all(p.why == plan.withdrawn for p in plan.placements if p.id in kept.verdict.change_set)
    assert plan.hbm.total_after == plan.hbm.total_before and patched is prepared.front
    assert plan.verdict is not None and plan.verdict.change_set == []
    assert plan.verdict.change_set_name.startswith("no change: the change set was withdrawn, XLA:CPU does not")
    assert plan.verdict.measured_by == "XLA:CPU" and plan.verdict.worst_after_bytes == 444 * MIB
    assert plan.verification is not None and plan.verification.confirmed is False


@pytest.mark.parametrize("target", ["cpu", "v6e"])
def test_nothing_is_recommended_on_a_step_whose_gradients_are_pinned(target: str) -> None:
    """JAX's own pinned step: XLA leaves every gradient at its shard, and the plan recommends nothing."""
    plan, _ = make_plan(
        prepare(parse_hlo_file(CORPUS / "jax" / "jax_llama_scan_L8_fsdp4_tp2_pinned.hlo"), target, MESH)
    )
    assert not any(p.recommended for p in plan.placements) and not any(a.recommended for a in plan.alternatives)
    assert plan.hbm.total_after == plan.hbm.total_before


PINNED = [c for c in CI_SUBSET if c.pinned and c.front_end == "jax"]


PINNED_PARAMS = [pytest.param(c, id=c.name) for c in PINNED]


@pytest.mark.xla
@pytest.mark.parametrize("case", PINNED_PARAMS)
def test_pinned_grid_steps_get_no_recommendation_on_either_compiler(case: Case) -> None:
    """Pins that change no sharding are never recommended; before, annotations were sized as buffers of their own
    and a bf16 step's f32 accumulators were lost behind them (352.1 -> 288.1 MiB claimed, XLA:CPU saves nothing)."""
    assert not ensure_references([case])
    module = parse_hlo_file(reference_path(case))
    for target in ("cpu", case.chip or "v6e"):
        plan, _ = make_plan(prepare(module, target))
        assert [p.id for p in plan.placements if p.recommended] == [], target
        for p in plan.placements:
            if p.why == IDLE_WHY:
                assert p.predicted_total_alone == plan.hbm.total_before, (target, p.id)


LM_STEP = next(
    c for c in CI_SUBSET if c.front_end == "jax" and c.step == "lm" and c.partitioner == "gspmd" and not c.pinned
)


@pytest.mark.xla
def test_a_tpu_plan_claims_nothing_for_returning_a_gradient_smaller() -> None:
    """XLA:TPU fills a late-written output's allocation with prefetches: the LM step's returned embedding and head
    gradients are findings on both compilers, recommended for XLA:CPU (which saves what is predicted) only."""
    assert not ensure_references([LM_STEP])
    module = parse_hlo_file(reference_path(LM_STEP))
    tpu, _ = make_plan(prepare(module, "v6e"))
    outputs = [p for p in tpu.placements if p.kind == PIN_OUTPUT]
    assert outputs and all(not p.recommended for p in outputs)
    assert all(p.why == UNCLAIMED_OUTPUT_WHY.format("v6e") for p in outputs)
    assert any(p.recommended for p in tpu.placements if p.kind != PIN_OUTPUT)
    cpu, _ = make_plan(prepare(module, "cpu"))
    assert any(p.recommended for p in cpu.placements if p.kind == PIN_OUTPUT)

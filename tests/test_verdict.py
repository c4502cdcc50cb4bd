"""The verdict on the bundled step's real plan, for capacities on each side of its before and after numbers.

The plan is XLA:CPU's, as torch_xla's own CPU run compiles the step: there the stacked gradients lose
an axis and pinning saves memory (XLA:TPU shards them as their weights, and its plan changes nothing).
"""

from __future__ import annotations

import pytest

from planner.data import DEFAULT_DUMP
from planner.hlo.parser import parse_hlo_file
from planner.mesh import Mesh
from planner.plan.planner import PIN_EVERY_PARAMETER, make_plan
from planner.plan.verdict import verdict
from planner.prepare import prepare

MIB = 1 << 20


@pytest.fixture(scope="module")
def plan():
    plan, _ = make_plan(
        prepare(parse_hlo_file(DEFAULT_DUMP), "cpu", Mesh.parse("fsdp=4,tp=2")), capacity_bytes=32 << 30
    )
    return plan


@pytest.mark.parametrize(
    ("capacity_mib", "fits_before", "fits_after", "summary"),
    [
        (None, None, None, "HBM per chip 659.8 MiB -> 520.8 MiB with the plan; no capacity given (pass --chip or --hbm for a fit verdict)"),
        (1024, True, True, "fits: 520.8 MiB per chip after the plan, 503.2 MiB to spare on 1.0 GiB; before 659.8 MiB"),
        (600, False, True, "fits after the plan: 520.8 MiB per chip, 79.2 MiB to spare on 600.0 MiB; before it does not fit (659.8 MiB, 1.1x 600.0 MiB)"),
        (500, False, False, "does not fit: 520.8 MiB per chip after the plan, 1.0x 500.0 MiB (20.8 MiB over); before 659.8 MiB (1.3x)"),
    ],
    ids=["no_capacity", "fits", "fits_after_only", "does_not_fit"],
)  # fmt: skip
def test_verdict_states_fit_and_margin_of_the_worst_chip(plan, capacity_mib, fits_before, fits_after, summary) -> None:
    capacity = None if capacity_mib is None else capacity_mib * MIB
    hbm = plan.hbm.model_copy(update={"capacity_bytes": capacity})
    v = verdict(hbm, plan.placements, PIN_EVERY_PARAMETER, None)
    assert (v.fits_before, v.fits_after) == (fits_before, fits_after)
    assert v.summary == summary
    assert v.worst_before_bytes == max(plan.hbm.per_chip_before.values())
    assert v.worst_after_bytes == max(plan.hbm.per_chip_after.values())
    if capacity is not None:
        assert v.margin_after_bytes == capacity - v.worst_after_bytes


def test_plan_carries_its_verdict_first(plan) -> None:
    v = plan.verdict
    assert next(iter(plan.model_dump())) == "verdict"
    assert v.fits_before and v.fits_after and v.chip is None and v.capacity_bytes == 32 << 30
    assert v.change_set == [p.id for p in plan.placements if p.recommended] and len(v.change_set) == 9
    assert v.change_set_name == "pin every scanned parameter and its gradient (9 pins)"
    assert v.saves_bytes == v.worst_before_bytes - v.worst_after_bytes

"""The verdict on the bundled step's real plan, for capacities on each side of its before and after numbers.

The plan is XLA:CPU's, as torch_xla's own CPU run compiles the step: there the stacked gradients lose
an axis and pinning saves memory (XLA:TPU shards them as their weights, and its plan changes nothing).
"""

from __future__ import annotations

import pytest

from planner.data import DEFAULT_DUMP
from planner.hlo.text.parser import parse_hlo_file
from planner.mesh import Mesh
from planner.plan.planner import PIN_EVERY_PARAMETER, make_plan
from planner.plan.verdict import DOES_NOT_FIT, FITS, TOO_CLOSE, Band, Measured, call, verdict
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


# A band as the sweep records it: the model has been 20% under and 25% over the compiler on this kind of step.
BAND = Band("XLA:CPU gspmd/torch_xla", 16, -0.2, 0.25)


@pytest.mark.parametrize(
    ("predicted_mib", "capacity_mib", "said"),
    [
        (100, 125, FITS),  # the compiler has allocated at most 100 / 0.8 = 125 for such a prediction
        (100, 124, TOO_CLOSE),
        (100, 81, TOO_CLOSE),
        (100, 79, DOES_NOT_FIT),  # and at least 100 / 1.25 = 80
    ],
    ids=["fits_at_the_band", "just_inside_above", "just_inside_below", "over_the_band"],
)
def test_a_verdict_is_said_only_where_it_holds_across_the_band(predicted_mib, capacity_mib, said) -> None:
    assert call(predicted_mib * MIB, capacity_mib * MIB, BAND) == said
    assert call(predicted_mib * MIB, None, BAND) == "no capacity"


def test_too_close_to_call_names_the_range_and_the_command(plan) -> None:
    hbm = plan.hbm.model_copy(update={"capacity_bytes": 520 * MIB})
    command = "spmd-planner plan STEP.hlo --mesh fsdp=4,tp=2 --hbm 545259520B --verify"
    v = verdict(hbm, plan.placements, PIN_EVERY_PARAMETER, None, band=BAND, verify_command=command)
    assert (v.call_before, v.call_after) == (DOES_NOT_FIT, TOO_CLOSE)
    assert (v.fits_before, v.fits_after) == (False, None)
    assert v.error_band == [-0.2, 0.25] and v.verify_command == command
    assert v.summary == (
        "too close to call after the plan: 520.8 MiB per chip predicted on 520.0 MiB, which on XLA:CPU "
        "gspmd/torch_xla steps the compiler has allocated as 416.7 MiB to 651.0 MiB (-20% to +25% from the "
        "prediction, 16 reference steps); before 659.8 MiB (does not fit); verify it: " + command
    )


def test_measured_bytes_decide_without_a_band(plan) -> None:
    hbm = plan.hbm.model_copy(update={"capacity_bytes": 600 * MIB})
    measured = Measured("XLA:CPU", 633 * MIB, 524 * MIB)
    v = verdict(hbm, plan.placements, PIN_EVERY_PARAMETER, None, band=BAND, measured=measured)
    assert (v.call_before, v.call_after) == (DOES_NOT_FIT, FITS) and v.error_band is None
    assert v.measured_by == "XLA:CPU" and v.worst_after_bytes == 524 * MIB
    assert v.summary.endswith("(as XLA:CPU measures it)")


def test_a_maxtext_step_is_banded_by_the_maxtext_steps_most_like_it_not_by_the_jax_grid() -> None:
    """The band a MaxText step's verdict keeps is drawn from MaxText's reference steps weighted by likeness (libtpu,
    partitioner, chip, size: `similar_steps`), not from the JAX grid's GSPMD band, whose widest step would make
    every MaxText verdict timid, nor from MaxText's own widest step."""
    from planner.memory.report import reference_steps, signed_error
    from planner.plan.similar_steps import StepTraits
    from planner.plan.verdict import band_of

    steps = reference_steps("tpu", "maxtext")
    assert len(steps) >= 30 and {s["partitioner"] for s in steps} == {"gspmd", "shardy"}
    # Llama 3.1 405B on MaxText's default v6e-256 mesh under GSPMD, libtpu 0.0.52: XLA:TPU refuses it at 42.79 GiB
    # on a 31.24 GiB chip.
    predicted = next(
        s["predicted_bytes"] for s in steps if s["name"].startswith("maxtext_llama3.1-405b_L126_v6e-256_gspmd")
    )
    band = band_of("tpu", "gspmd", "maxtext", StepTraits("0.0.52", "gspmd", "v6e", predicted))
    assert band is not None and band.kind == "XLA:TPU maxtext steps most like this one"
    assert call(predicted, int(31.24 * (1 << 30)), band) == DOES_NOT_FIT
    widest = signed_error("tpu", ("*/maxtext",))
    jax_band = band_of("tpu", "gspmd", "jax")
    assert widest is not None and jax_band is not None
    assert widest[2] < band.under <= 0 <= band.over < widest[3] + 0.05
    assert jax_band.under < band.under and band.over < jax_band.over


def test_the_band_weighs_references_by_likeness() -> None:
    from planner.plan.similar_steps import ReferenceStep, StepTraits, similar_band, weight, weighted_quantile

    step = StepTraits("0.0.52", "shardy", "v6e", 10 << 30)
    alike = ReferenceStep("a", 0.01, "0.0.52", "shardy", "v6e", 10 << 30)
    other_release = ReferenceStep("b", 0.01, "0.0.20", "shardy", "v6e", 10 << 30)
    smaller = ReferenceStep("c", 0.01, "0.0.52", "shardy", "v6e", 1 << 30)
    assert weight(step, alike) == 4 * weight(step, other_release) == 10 * weight(step, smaller)
    assert weighted_quantile([0.0, 1.0], [1.0, 1.0], 0.5) == 0.5
    assert weighted_quantile([0.0, 1.0], [3.0, 1.0], 0.05) == 0.0
    # One unlike step far off moves the band little; the same step alike moves it.
    references = [ReferenceStep(f"r{k}", 0.01 * (k % 3 - 1), "0.0.52", "shardy", "v6e", 10 << 30) for k in range(12)]
    base = similar_band(step, references)
    far_unlike = similar_band(step, [*references, ReferenceStep("x", -0.3, "0.0.20", "gspmd", "v5e", 100 << 20)])
    far_alike = similar_band(step, [*references, ReferenceStep("y", -0.3, "0.0.52", "shardy", "v6e", 10 << 30)])
    assert base is not None and far_unlike is not None and far_alike is not None
    assert abs(far_unlike[1] - base[1]) < 0.005 and far_alike[1] < base[1] - 0.01
    assert similar_band(step, references[:3]) is None  # too few to say

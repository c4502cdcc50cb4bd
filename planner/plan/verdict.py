"""The verdict: does the step fit the chip, before and after the one recommended change set.

It is the first thing every report, page and JSON says. It speaks of the worst
chip: a step fits only if every chip does, and chips differ (a replicated
buffer costs every chip the same, an uneven split does not).

A prediction is not the compiler's number, so the verdict is said only where
it holds across the error the model has had on that kind of step (`Band`,
measured by the reference sweep): "fits" when even the most the compiler has
allocated over our prediction stays within capacity, "does not fit" when even
the least stays over it, and otherwise "too close to call", with the command
that asks the compiler. A verdict on bytes the compiler measured (`--verify`)
needs no band.

A worked example, the bundled torch_xla step planned for XLA:CPU with 32 GiB
per chip: worst chip 659.8 MiB before, 520.8 MiB after pinning every scanned
parameter, so "fits: 520.8 MiB per chip after the plan, 31.5 GiB to spare on
32.0 GiB; before 659.8 MiB". With 600 MiB it is too close to call: on
GSPMD torch_xla steps the model has been 40.3% under to 19.8% over XLA:CPU,
so with the 5-point margin (-45.3% to +24.8%) 520.8 MiB predicted stands for
417.3 to 952.1 MiB allocated.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.hlo.structure.frontend import JAX, MAXTEXT, front_end_of
from planner.hlo.text.shardy_import import partitioner_of
from planner.memory.report import ANY_PARTITIONER, reference_steps, signed_error
from planner.mesh import Mesh
from planner.plan.model import HbmInfo, PlacementInfo, VerdictInfo
from planner.plan.similar_steps import ReferenceStep, StepTraits, similar_band
from planner.prepare import PreparedModule
from planner.units import format_bytes

FITS, DOES_NOT_FIT, TOO_CLOSE, NO_CAPACITY = "fits", "does not fit", "too close to call", "no capacity"


@dataclass(frozen=True)
class Band:
    """How far the model has been from the compiler on one kind of step: (ours - compiler) / compiler, signed.

    `under` is the most the model has predicted below the compiler (<= 0), `over` the most above (>= 0),
    each already widened by the margin the verdict keeps (`VERDICT_MARGIN`, applied by `band_of`).
    """

    kind: str
    num_cases: int
    under: float
    over: float

    def compiler_range(self, predicted: int) -> tuple[int, int]:
        """The compiler's bytes this prediction has stood for: 100 predicted with (-20%, +25%) is 80 to 125."""
        return round(predicted / (1 + self.over)), round(predicted / (1 + self.under))


# The verdict's band is the widest error measured on the kind of step, widened by this much on each side.
VERDICT_MARGIN = 0.05


def band_for(prepared: PreparedModule, predicted_bytes: int | None = None) -> Band | None:
    """The measured error of the model on steps of this kind (partitioner and front end: torch_xla, MaxText or
    other JAX) for the target's compiler; with `predicted_bytes`, drawn from the references most like this
    step where they were recorded (`similar_steps`)."""
    partitioner = partitioner_of(prepared.source)
    traits = None
    if predicted_bytes is not None:
        traits = StepTraits(prepared.libtpu, partitioner, prepared.target.name, predicted_bytes)
    return band_of(prepared.compiler, partitioner, front_end_of(prepared.source), traits)


def band_of(compiler: str, partitioner: str, front_end: str, step: StepTraits | None = None) -> Band | None:
    """The sweep's signed error for this compiler on `partitioner/front_end` steps, widened by `VERDICT_MARGIN`.

    MaxText's steps are JAX steps: where too few of them were measured under a partitioner, MaxText's steps under
    either partitioner stand for them (the same model and memory rules, the partitioner's loops equal XLA:TPU's
    under both), then JAX's band. A population's widest error would widen the verdict of every MaxText step by a
    grid step unlike it (the JAX grid's GSPMD band on XLA:TPU spans -35% to +41%, MaxText's -11% to +4%)."""
    if step is not None:
        similar = similar_band(step, [ReferenceStep(**r) for r in reference_steps(compiler, front_end)])
        if similar is not None:
            count, under, over = similar
            return Band(
                f"{_compiler_name(compiler)} {front_end} steps most like this one", count, max(under, -0.95), over
            )
    kinds = [f"{partitioner}/{front_end}"]
    if front_end == MAXTEXT:
        kinds += [f"{ANY_PARTITIONER}{MAXTEXT}", f"{partitioner}/{JAX}"]
    found = signed_error(compiler, tuple(kinds))
    if found is None:
        return None
    kind, num_cases, under, over = found
    name = _compiler_name(compiler)
    label = f"{name} {kind}" if kind != "all" else f"all of {name}'s"
    return Band(label, num_cases, max(under - VERDICT_MARGIN, -0.95), over + VERDICT_MARGIN)


def _compiler_name(compiler: str) -> str:
    return {"cpu": "XLA:CPU", "tpu": "XLA:TPU"}.get(compiler, compiler)


def verify_command(mesh: Mesh | None, chip: str | None, capacity_bytes: int | None) -> str:
    """The command that asks the compiler itself, for a verdict the band cannot decide."""
    target = f"--chip {chip}" if chip else f"--hbm {capacity_bytes}B" if capacity_bytes is not None else ""
    parts = ["spmd-planner plan STEP.hlo", f"--mesh {mesh.to_text()}" if mesh is not None else "", target, "--verify"]
    return " ".join(p for p in parts if p)


@dataclass(frozen=True)
class Measured:
    """The compiler's own bytes per chip for the step as given and with the change set (from `--verify`)."""

    compiler: str
    before_bytes: int
    after_bytes: int


def call(predicted: int, capacity: int | None, band: Band | None) -> str:
    """fits, does not fit, too close to call (within the band of capacity) or no capacity."""
    if capacity is None:
        return NO_CAPACITY
    low, high = band.compiler_range(predicted) if band is not None else (predicted, predicted)
    if high <= capacity:
        return FITS
    if low > capacity:
        return DOES_NOT_FIT
    return TOO_CLOSE


def _worst(per_chip: dict[str, int]) -> tuple[str, int]:
    chip = max(per_chip, key=lambda c: (per_chip[c], -int(c) if c.isdigit() else 0))
    return chip, per_chip[chip]


def change_set_name(
    placements: list[PlacementInfo],
    pin_every_name: str | None,
    withdrawn: str | None = None,
    framework: str | None = None,
    left_out: str | None = None,
) -> str:
    """What the recommended placements are, in words; `framework` (torch_xla) narrows "no placement" to what
    it can apply; `left_out`, what the step planned leaves out of the step that trains, is why a partial step
    gets none."""
    chosen = [p for p in placements if p.recommended]
    if withdrawn is not None:
        return f"no change: the change set was withdrawn, {withdrawn}"
    if left_out is not None and not chosen:
        return f"no change: the step planned leaves out {left_out}, which decides what a placement saves"
    if not chosen:
        which = f"no placement {framework} can apply" if framework else "no placement"
        return f"no change: {which} lowers HBM per chip"
    if pin_every_name is not None:
        return f"{pin_every_name} ({len(chosen)} pins)"
    if len(chosen) == 1:
        return chosen[0].in_words
    return f"{len(chosen)} placements: " + "; ".join(p.in_words for p in chosen)


def verdict(
    hbm: HbmInfo,
    placements: list[PlacementInfo],
    pin_every_name: str | None,
    chip: str | None,
    withdrawn: str | None = None,
    band: Band | None = None,
    measured: Measured | None = None,
    verify_command: str | None = None,
    framework: str | None = None,
    left_out: str | None = None,
) -> VerdictInfo:
    """The verdict from the plan's HBM numbers, or the compiler's when `measured`.

    `pin_every_name` names the change set when it is pin-every, `withdrawn` says why the compiler verify ran
    did not back it, `band` is the model's measured error on this kind of step (None: the point estimate
    decides), `verify_command` what to run when the band does not decide, `framework` the front end whose
    handles the placements were limited to (torch_xla), for the words of an empty change set, `left_out` what
    the step planned leaves out of the step that trains (its change set is empty).
    """
    worst_before_chip, worst_before = _worst(hbm.per_chip_before)
    worst_after_chip, worst_after = _worst(hbm.per_chip_after)
    if measured is not None:
        worst_before, worst_after, band = measured.before_bytes, measured.after_bytes, None
    capacity = hbm.capacity_bytes
    call_before, call_after = call(worst_before, capacity, band), call(worst_after, capacity, band)
    name = change_set_name(placements, pin_every_name, withdrawn, framework, left_out)
    where = f"{chip} ({format_bytes(capacity)})" if chip and capacity is not None else format_bytes(capacity or 0)
    if capacity is None:
        summary = _no_capacity(worst_before, worst_after)
    elif TOO_CLOSE in (call_before, call_after):
        assert band is not None
        summary = _too_close(worst_before, worst_after, call_before, call_after, where, band, verify_command)
    else:
        summary = _summary(worst_before, worst_after, capacity, where)
    if measured is not None:
        summary += f" (as {measured.compiler} measures it)"
    return VerdictInfo(
        capacity_bytes=capacity,
        chip=chip,
        fits_before={FITS: True, DOES_NOT_FIT: False}.get(call_before),
        fits_after={FITS: True, DOES_NOT_FIT: False}.get(call_after),
        call_before=call_before,
        call_after=call_after,
        error_band=None if band is None else [band.under, band.over],
        error_band_kind=None if band is None else band.kind,
        measured_by=None if measured is None else measured.compiler,
        verify_command=verify_command if TOO_CLOSE in (call_before, call_after) else None,
        worst_chip_before=worst_before_chip,
        worst_before_bytes=worst_before,
        worst_chip_after=worst_after_chip,
        worst_after_bytes=worst_after,
        margin_before_bytes=capacity - worst_before if capacity is not None else None,
        margin_after_bytes=capacity - worst_after if capacity is not None else None,
        change_set=[p.id for p in placements if p.recommended],
        change_set_name=name,
        saves_bytes=worst_before - worst_after,
        summary=summary,
    )


def _no_capacity(before: int, after: int) -> str:
    if before == after:
        return (
            f"HBM per chip {format_bytes(before)}, unchanged by the plan; no capacity given "
            "(pass --chip or --hbm for a fit verdict)"
        )
    return (
        f"HBM per chip {format_bytes(before)} -> {format_bytes(after)} with the plan; no capacity given "
        "(pass --chip or --hbm for a fit verdict)"
    )


def _too_close(
    before: int, after: int, call_before: str, call_after: str, where: str, band: Band, verify_command: str | None
) -> str:
    ask = f"; verify it: {verify_command}" if verify_command else ""
    if call_after == TOO_CLOSE:
        head = f"{TOO_CLOSE} after the plan: {format_bytes(after)} per chip predicted on {where}, {_range(after, band)}"
        return f"{head}; before {format_bytes(before)} ({call_before}){ask}"
    head = f"{call_after} after the plan: {format_bytes(after)} per chip on {where}"
    return f"{head}; before {format_bytes(before)} is {TOO_CLOSE}, {_range(before, band)}{ask}"


def _range(predicted: int, band: Band) -> str:
    low, high = band.compiler_range(predicted)
    return (
        f"which on {band.kind} steps the compiler has allocated as {format_bytes(low)} to {format_bytes(high)} "
        f"({band.under:+.0%} to {band.over:+.0%} from the prediction, {band.num_cases} reference steps)"
    )


def _summary(before: int, after: int, capacity: int, where: str) -> str:
    if after <= capacity:
        spare = f"{format_bytes(capacity - after)} to spare on {where}"
        if before <= capacity:
            return f"fits: {format_bytes(after)} per chip after the plan, {spare}; before {format_bytes(before)}"
        return (
            f"fits after the plan: {format_bytes(after)} per chip, {spare}; before it does not fit "
            f"({format_bytes(before)}, {before / capacity:.1f}x {where})"
        )
    return (
        f"does not fit: {format_bytes(after)} per chip after the plan, {after / capacity:.1f}x {where} "
        f"({format_bytes(after - capacity)} over); before {format_bytes(before)} ({before / capacity:.1f}x)"
    )

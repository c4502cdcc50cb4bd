"""The verdict: does the step fit the chip, before and after the one recommended change set.

It is the first thing every report, page and JSON says. It speaks of the worst
chip: a step fits only if every chip does, and chips differ (a replicated
buffer costs every chip the same, an uneven split does not).

A worked example, the bundled torch_xla step planned for XLA:CPU with 32 GiB
per chip: worst chip 659.8 MiB before, 520.8 MiB after pinning every scanned
parameter, so "fits: 520.8 MiB per chip after the plan, 31.5 GiB to spare on
32.0 GiB; before 659.8 MiB".
"""

from __future__ import annotations

from planner.plan.model import HbmInfo, PlacementInfo, VerdictInfo
from planner.units import format_bytes


def _worst(per_chip: dict[str, int]) -> tuple[str, int]:
    chip = max(per_chip, key=lambda c: (per_chip[c], -int(c) if c.isdigit() else 0))
    return chip, per_chip[chip]


def change_set_name(placements: list[PlacementInfo], pin_every_name: str | None, withdrawn: str | None = None) -> str:
    """What the recommended placements are, in words."""
    chosen = [p for p in placements if p.recommended]
    if withdrawn is not None:
        return f"no change: the change set was withdrawn, {withdrawn}"
    if not chosen:
        return "no change: no placement lowers HBM per chip"
    if pin_every_name is not None:
        return f"{pin_every_name} ({len(chosen)} pins)"
    if len(chosen) == 1:
        return chosen[0].summary
    return f"{len(chosen)} placements: " + "; ".join(p.summary for p in chosen)


def verdict(
    hbm: HbmInfo,
    placements: list[PlacementInfo],
    pin_every_name: str | None,
    chip: str | None,
    withdrawn: str | None = None,
) -> VerdictInfo:
    """The verdict from the plan's HBM numbers; `pin_every_name` names the change set when it is pin-every,
    `withdrawn` says why the compiler verify ran did not back it."""
    worst_before_chip, worst_before = _worst(hbm.per_chip_before)
    worst_after_chip, worst_after = _worst(hbm.per_chip_after)
    capacity = hbm.capacity_bytes
    margin_before = capacity - worst_before if capacity is not None else None
    margin_after = capacity - worst_after if capacity is not None else None
    name = change_set_name(placements, pin_every_name, withdrawn)
    return VerdictInfo(
        capacity_bytes=capacity,
        chip=chip,
        fits_before=None if capacity is None else worst_before <= capacity,
        fits_after=None if capacity is None else worst_after <= capacity,
        worst_chip_before=worst_before_chip,
        worst_before_bytes=worst_before,
        worst_chip_after=worst_after_chip,
        worst_after_bytes=worst_after,
        margin_before_bytes=margin_before,
        margin_after_bytes=margin_after,
        change_set=[p.id for p in placements if p.recommended],
        change_set_name=name,
        saves_bytes=worst_before - worst_after,
        summary=_summary(worst_before, worst_after, capacity, chip),
    )


def _summary(before: int, after: int, capacity: int | None, chip: str | None) -> str:
    if capacity is None:
        return (
            f"HBM per chip {format_bytes(before)} -> {format_bytes(after)} with the plan; no capacity given "
            "(pass --chip or --hbm for a fit verdict)"
        )
    where = f"{chip} ({format_bytes(capacity)})" if chip else format_bytes(capacity)
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

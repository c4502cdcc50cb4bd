"""Chips with identical numbers, collapsed: "all 256 chips: 712.1 GiB" instead of 256 lines.

Shared by the CLI report and the dashboard, so both group and name chips alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.chip_labels import chip_ranges, chips_text
from planner.plan.model import Plan

__all__ = ["ChipGroup", "chip_groups", "chip_ranges", "chips_text"]


@dataclass(frozen=True)
class ChipGroup:
    """Chips predicted to hold the same bytes before and after the plan."""

    label: str  # "all 256 chips", "chip 0", "255 chips (1-255)"
    count: int
    before_bytes: int
    after_bytes: int
    over_before: bool
    over_after: bool


def chip_groups(plan: Plan) -> list[ChipGroup]:
    """Chips grouped by identical (before, after) bytes, fullest first."""
    hbm = plan.hbm
    by_value: dict[tuple[int, int], list[str]] = {}
    for c, before in hbm.per_chip_before.items():
        by_value.setdefault((before, hbm.per_chip_after.get(c, before)), []).append(c)
    total = len(hbm.per_chip_before)
    capacity = hbm.capacity_bytes
    groups = []
    for (before, after), chips in sorted(by_value.items(), key=lambda kv: (-kv[0][0], -kv[0][1])):
        over_before, over_after = capacity is not None and before > capacity, capacity is not None and after > capacity
        groups.append(ChipGroup(chips_text(chips, total), len(chips), before, after, over_before, over_after))
    return groups

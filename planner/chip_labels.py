"""Naming sets of chips briefly: `all 256 chips`, `chip 3`, `64 chips (0-63)`.

Reports at 256 or 1,024 chips must never list every id; the memory report, the plan report and
the dashboard all name chips through these.
"""

from __future__ import annotations


def chip_ranges(chips: list[str], max_ranges: int = 4) -> str:
    """`0-63, 128-191`: chip ids as runs; past `max_ranges` runs, the first ones and an ellipsis."""
    return index_ranges([int(c) for c in chips], max_ranges)


def index_ranges(indices: list[int], max_ranges: int = 4) -> str:
    """`0-61` or `0-3, 5, 7-9, …`: integers as runs; past `max_ranges` runs, the first ones and an ellipsis."""
    ids = sorted(indices)
    runs: list[tuple[int, int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs]
    if len(parts) <= max_ranges:
        return ", ".join(parts)
    return ", ".join(parts[: max_ranges - 1]) + ", …"


def chips_text(chips: list[str], total: int) -> str:
    """`all 256 chips`, `chip 3` or `64 chips (0-63)`."""
    if len(chips) == total:
        return "the only chip" if total == 1 else f"all {total:,} chips"
    if len(chips) == 1:
        return f"chip {chips[0]}"
    return f"{len(chips):,} chips ({chip_ranges(chips)})"

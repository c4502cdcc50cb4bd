"""A search drawn: one horizontal bar per candidate (predicted HBM per chip with its plan), the chip's
capacity as a line, and a mark where the compiler measured the candidate.

Bars are drawn to a scale of twice the capacity (or of the largest prediction when no capacity is
known): a candidate far over capacity runs to the edge and is labelled with its bytes, so the ones
near the line stay readable.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.models import SearchRow
from api.views import human_bytes

ROW_HEIGHT = 22
LABEL_WIDTH = 360
PLOT_WIDTH = 420
VALUE_WIDTH = 110


@dataclass(frozen=True)
class SearchBar:
    label: str
    y: float
    width: float
    fits: bool
    clipped: bool
    value: str
    compiled_x: float | None
    compiled: str | None


@dataclass(frozen=True)
class SearchChart:
    width: int
    height: int
    plot_left: int
    plot_width: int
    capacity_x: float | None
    capacity: str | None
    bars: list[SearchBar]


def search_chart(rows: list[SearchRow]) -> SearchChart:
    planned = [r for r in rows if r.predicted_after_bytes is not None]
    capacity = next((r.capacity_bytes for r in planned if r.capacity_bytes is not None), None)
    largest = max([r.predicted_after_bytes or 0 for r in planned] + [1])
    top = 2 * capacity if capacity is not None else largest

    def x(value: int) -> float:
        return PLOT_WIDTH * min(value, top) / top

    bars = []
    for i, r in enumerate(planned):
        predicted = r.predicted_after_bytes or 0
        compiled_x = LABEL_WIDTH + x(r.compiled_bytes) if r.compiled_bytes is not None else None
        bars.append(SearchBar(
            label=f"{i + 1}. {r.candidate}", y=i * ROW_HEIGHT, width=x(predicted),
            fits=r.headroom_bytes is not None and r.headroom_bytes >= 0, clipped=predicted > top,
            value=human_bytes(predicted), compiled_x=compiled_x,
            compiled=f"{r.compiler}: {human_bytes(r.compiled_bytes)}" if r.compiled_bytes is not None else None,
        ))  # fmt: skip
    return SearchChart(
        width=LABEL_WIDTH + PLOT_WIDTH + VALUE_WIDTH,
        height=max(len(bars), 1) * ROW_HEIGHT + 24,
        plot_left=LABEL_WIDTH,
        plot_width=PLOT_WIDTH,
        capacity_x=LABEL_WIDTH + x(capacity) if capacity is not None else None,
        capacity=human_bytes(capacity) if capacity is not None else None,
        bars=bars,
    )

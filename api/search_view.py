"""A search drawn: one horizontal bar per candidate (predicted HBM per chip with its plan), the chip's
capacity as a line, and a mark where the compiler measured the candidate.

Bars are drawn to a scale of twice the capacity when some candidate (predicted or compiled) comes within
half of it: a candidate far over capacity runs to the edge and is labelled with its bytes, so the ones
near the line stay readable. When every candidate is far below capacity (a small step on a 32 GiB chip),
the scale is the largest of them instead, so bars and compiled marks stay visible, and the capacity is
said to be off the scale.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.views import human_bytes
from planner.wire import SearchRow

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
    against: str | None  # the compiled bytes against the prediction, in words


@dataclass(frozen=True)
class SearchChart:
    width: int
    height: int
    plot_left: int
    plot_width: int
    capacity_x: float | None
    capacity: str | None
    bars: list[SearchBar]
    scale: str  # what the bars' axis runs to


def search_chart(rows: list[SearchRow]) -> SearchChart:
    planned = [r for r in rows if r.predicted_after_bytes is not None]
    capacity = next((r.capacity_bytes for r in planned if r.capacity_bytes is not None), None)
    largest = max([r.predicted_after_bytes or 0 for r in planned] + [r.compiled_bytes or 0 for r in planned] + [1])
    on_capacity = capacity is not None and 2 * largest >= capacity
    top = 2 * capacity if capacity is not None and on_capacity else round(largest * 1.25)
    if capacity is None:
        scale = f"bars run to {human_bytes(top)}"
    elif on_capacity:
        scale = f"bars run to twice the capacity ({human_bytes(top)}); the line is the chip's {human_bytes(capacity)}"
    else:
        scale = (f"bars run to {human_bytes(top)}: every candidate is under half the chip's {human_bytes(capacity)}, "
                 "which is off this scale")  # fmt: skip

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
            against=compiled_against_predicted(r),
        ))  # fmt: skip
    return SearchChart(
        width=LABEL_WIDTH + PLOT_WIDTH + VALUE_WIDTH,
        height=max(len(bars), 1) * ROW_HEIGHT + 24,
        plot_left=LABEL_WIDTH,
        plot_width=PLOT_WIDTH,
        capacity_x=LABEL_WIDTH + x(capacity) if capacity is not None and on_capacity else None,
        capacity=human_bytes(capacity) if capacity is not None else None,
        bars=bars,
        scale=scale,
    )


def compiled_against_predicted(r: SearchRow) -> str | None:
    """Both numbers are the candidate's step with its plan applied: the prediction is the planner's model of
    the chip's compiler, the compiled bytes that compiler's own (XLA:CPU where libtpu is missing)."""
    if r.compiled_bytes is None or not r.predicted_after_bytes:
        return None
    error = (r.compiled_bytes - r.predicted_after_bytes) / r.predicted_after_bytes
    ratio = r.compiled_bytes / r.predicted_after_bytes
    size = f"{ratio:.1f}x the prediction" if ratio >= 2 or ratio <= 0.5 else f"{error:+.1%} on the prediction"
    return f"{r.compiler} allocates {human_bytes(r.compiled_bytes)} for the step with its plan: {size}"

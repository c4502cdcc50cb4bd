"""The memory timeline as the page draws it: bytes live per device over program order, before and after.

One small chart per computation (the entry, then each loop body), every chart on the same byte
scale from zero so a body's line can be read against the entry's, each with its peak marked. The
x axis is the series' own positions: a long computation was cut to about 400 of them, the
lowest and highest of each stretch (`planner.memory.timeline`), so spacing is even per point,
not exactly per instruction.
"""

from __future__ import annotations

from dataclasses import dataclass

from api.views import human_bytes, nice_step
from planner.plan.model import Plan, TimelineSeries

WIDTH = 500
HEIGHT = 170
_LEFT = 64
_RIGHT = 12
_TOP = 18
_BOTTOM = 22


@dataclass(frozen=True)
class Peak:
    x: float
    y: float
    bytes: int
    position: str  # the instruction at the peak


@dataclass(frozen=True)
class Line:
    points: str  # the polyline's "x,y x,y ..."
    peak: Peak
    num_positions: int


@dataclass(frozen=True)
class TimelineChart:
    label: str
    computation: str
    before: Line | None
    after: Line | None


@dataclass(frozen=True)
class Timelines:
    width: int
    height: int
    plot_left: int
    plot_right: int
    plot_top: int
    plot_bottom: int
    ticks: list[tuple[float, str]]
    capacity_y: float | None
    charts: list[TimelineChart]


def timelines(plan: Plan) -> Timelines | None:
    """The plan's timelines as charts, or None when the plan has none (plans made before they existed)."""
    if not plan.timeline_before and not plan.timeline_after:
        return None
    everything = [*plan.timeline_before, *plan.timeline_after]
    peak = max((max(s.live_bytes, default=0) for s in everything), default=0) or 1
    capacity = plan.hbm.capacity_bytes
    on_scale = capacity is not None and capacity <= 2 * peak
    top = max(peak, capacity if on_scale and capacity else 0) * 1.1
    bottom = HEIGHT - _BOTTOM

    def y(value: int) -> float:
        return bottom - (bottom - _TOP) * value / top

    def line(series: TimelineSeries | None) -> Line | None:
        if series is None or not series.live_bytes:
            return None
        n = len(series.live_bytes)

        def x(i: int) -> float:
            return _LEFT + (WIDTH - _LEFT - _RIGHT) * (i / (n - 1) if n > 1 else 0.5)

        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(series.live_bytes))
        k = series.peak_index
        return Line(points, Peak(x(k), y(series.live_bytes[k]), series.live_bytes[k], series.positions[k]), n)

    after = {s.computation: s for s in plan.timeline_after}
    charts = [TimelineChart(s.label, s.computation, line(s), line(after.pop(s.computation, None)))
              for s in plan.timeline_before]  # fmt: skip
    charts += [TimelineChart(s.label, s.computation, None, line(s)) for s in after.values()]
    step = nice_step(top / 3)
    ticks = [(y(int(k * step)), human_bytes(int(k * step))) for k in range(int(top // step) + 1)]
    return Timelines(WIDTH, HEIGHT, _LEFT, WIDTH - _RIGHT, _TOP, bottom, ticks,
                     y(capacity) if capacity is not None and on_scale else None, charts)  # fmt: skip

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
class Strip:
    """A stretch of program order to hover: what runs there and the bytes live, before and after."""

    x: float
    width: float
    text: str


@dataclass(frozen=True)
class TimelineChart:
    label: str
    computation: str
    before: Line | None
    after: Line | None
    strips: tuple[Strip, ...] = ()


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


# Hover targets per chart: program order in this many stretches at most (each a transparent strip).
MAX_STRIPS = 80


def strips(before: TimelineSeries | None, after: TimelineSeries | None) -> tuple[Strip, ...]:
    """Stretches of the chart to hover, each saying the instructions it spans and the most bytes live in
    it before and after the plan (the two series are matched by their share of program order)."""
    lead = before if before is not None and before.live_bytes else after
    if lead is None or not lead.live_bytes:
        return ()
    n = len(lead.live_bytes)
    count = min(n, MAX_STRIPS)
    plot = WIDTH - _LEFT - _RIGHT
    out = []
    for k in range(count):
        lo, hi = k * n // count, max((k + 1) * n // count, k * n // count + 1)
        first, last = lead.positions[lo], lead.positions[hi - 1]
        most = max(range(lo, hi), key=lambda i: lead.live_bytes[i])
        where = first if first == last else f"{first} .. {last}, most live after {lead.positions[most]}"
        parts = [where]
        for name, series in (("before", before), ("after the plan", after)):
            if series is not None and series.live_bytes:
                m = len(series.live_bytes)
                a, b = lo * m // n, max(hi * m // n, lo * m // n + 1)
                parts.append(f"{name}: {human_bytes(max(series.live_bytes[a:b]))} live")
        out.append(Strip(_LEFT + plot * k / count, plot / count, "; ".join(parts)))
    return tuple(out)


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
    charts = []
    for s in plan.timeline_before:
        planned = after.pop(s.computation, None)
        charts.append(TimelineChart(s.label, s.computation, line(s), line(planned), strips(s, planned)))
    charts += [TimelineChart(s.label, s.computation, None, line(s), strips(None, s)) for s in after.values()]
    step = nice_step(top / 3)
    ticks = [(y(int(k * step)), human_bytes(int(k * step))) for k in range(int(top // step) + 1)]
    return Timelines(WIDTH, HEIGHT, _LEFT, WIDTH - _RIGHT, _TOP, bottom, ticks,
                     y(capacity) if capacity is not None and on_scale else None, charts)  # fmt: skip

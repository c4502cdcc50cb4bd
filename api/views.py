"""What the dashboard draws, computed here so the templates only place it.

Numbers become geometry (bar heights, grid colours) in Python; every string
that came from the HLO (names, metadata, source paths) reaches the page only
through the templates, which escape it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.plan.model import Plan

CHART_WIDTH = 760
CHART_HEIGHT = 260
_MARGIN_LEFT = 64
_MARGIN_BOTTOM = 28
_MARGIN_TOP = 16
_MARGIN_RIGHT = 120  # room for the capacity label beside its line


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,} B"


@dataclass(frozen=True)
class Bar:
    chip: str
    x: float
    width: float
    before_y: float
    before_height: float
    after_y: float
    after_height: float
    before_bytes: int
    after_bytes: int
    over_before: bool
    over_after: bool


@dataclass(frozen=True)
class Tick:
    y: float
    label: str


@dataclass(frozen=True)
class HbmChart:
    width: int
    height: int
    plot_left: int
    plot_right: int
    plot_bottom: float
    bars: list[Bar]
    ticks: list[Tick]
    capacity_y: float | None
    capacity_label: str
    over_before: list[str]
    over_after: list[str]


def hbm_chart(plan: Plan) -> HbmChart:
    """Bars of predicted HBM per chip, before and after the plan, under the chip's capacity line."""
    hbm = plan.hbm
    chips = sorted(hbm.per_chip_before, key=int)
    capacity = hbm.capacity_bytes
    peak = max([*hbm.per_chip_before.values(), *hbm.per_chip_after.values(), 1])
    # A capacity far above the use would flatten every bar: then it is named, not drawn to scale.
    on_scale = capacity is not None and capacity <= 4 * peak
    top = max(peak, capacity if on_scale and capacity else 0) * 1.08
    plot_h = CHART_HEIGHT - _MARGIN_BOTTOM - _MARGIN_TOP
    plot_w = CHART_WIDTH - _MARGIN_LEFT - _MARGIN_RIGHT
    slot = plot_w / max(len(chips), 1)
    bar_w = max(slot * 0.38, 1.0)
    bottom = CHART_HEIGHT - _MARGIN_BOTTOM

    def y(value: int) -> float:
        return bottom - plot_h * value / top

    bars = []
    for i, c in enumerate(chips):
        b, a = hbm.per_chip_before[c], hbm.per_chip_after.get(c, hbm.per_chip_before[c])
        x = _MARGIN_LEFT + i * slot + slot * 0.1
        over_b = capacity is not None and b > capacity
        over_a = capacity is not None and a > capacity
        bars.append(Bar(c, x, bar_w, y(b), bottom - y(b), y(a), bottom - y(a), b, a, over_b, over_a))
    step = _nice_step(top / 4)
    ticks = [Tick(y(int(k * step)), human_bytes(int(k * step))) for k in range(int(top // step) + 1)]
    return HbmChart(
        width=CHART_WIDTH,
        height=CHART_HEIGHT,
        plot_left=_MARGIN_LEFT,
        plot_right=CHART_WIDTH - _MARGIN_RIGHT,
        plot_bottom=bottom,
        bars=bars,
        ticks=ticks,
        capacity_y=y(capacity) if capacity is not None and on_scale else None,
        capacity_label=_capacity_label(capacity, peak, on_scale),
        over_before=[b.chip for b in bars if b.over_before],
        over_after=[b.chip for b in bars if b.over_after],
    )


def _capacity_label(capacity: int | None, peak: int, on_scale: bool) -> str:
    if capacity is None:
        return ""
    if on_scale:
        return f"capacity {human_bytes(capacity)}"
    return f"capacity {human_bytes(capacity)} is off the top of this chart: the fullest chip uses {peak / capacity:.1%}"


def _nice_step(raw: float) -> float:
    power = 2 ** math.floor(math.log2(max(raw, 1)))
    return float(power if raw / power < 1.5 else power * 2)


@dataclass(frozen=True)
class Cell:
    chip: str
    row: int
    col: int
    bytes: int
    fill: str
    over: bool


@dataclass(frozen=True)
class MeshGrid:
    title: str
    rows: int
    cols: int
    cells: list[Cell]
    axes: str


def mesh_grids(plan: Plan) -> list[MeshGrid]:
    """The mesh as a grid of chips (first axis down, the rest across), coloured by predicted HBM use."""
    chips = sorted(plan.hbm.per_chip_before, key=int)
    sizes = _mesh_sizes(plan.mesh, len(chips))
    rows = sizes[0]
    cols = max(len(chips) // max(rows, 1), 1)
    names = [part.split("=")[0] for part in plan.mesh.split(",")] if plan.mesh else ["devices"]
    axes = f"{names[0]} down, {' x '.join(names[1:])} across" if len(names) > 1 else f"{names[0]} across"
    reference = plan.hbm.capacity_bytes or max(plan.hbm.per_chip_before.values())
    grids = []
    for title, values in (("before", plan.hbm.per_chip_before), ("after", plan.hbm.per_chip_after)):
        cells = []
        for k, c in enumerate(chips):
            used = values.get(c, 0)
            cells.append(Cell(c, k // cols, k % cols, used, _heat(used / max(reference, 1)),
                              plan.hbm.capacity_bytes is not None and used > plan.hbm.capacity_bytes))  # fmt: skip
        grids.append(MeshGrid(title, rows, cols, cells, axes))
    return grids


def _mesh_sizes(mesh: str | None, count: int) -> list[int]:
    if not mesh:
        return [1, count]
    sizes = [int(part.split("=")[1]) for part in mesh.split(",")]
    return sizes if len(sizes) > 1 else [1, sizes[0]]


def _heat(fraction: float) -> str:
    """Green (little of the chip used) through amber to red (full or over)."""
    f = min(max(fraction, 0.0), 1.0)
    hue = 120 * (1 - f)
    return f"hsl({hue:.0f}, 70%, {78 - 30 * f:.0f}%)"


def breakdown_rows(plan: Plan) -> list[tuple[str, int, int]]:
    hbm = plan.hbm
    keys = sorted(set(hbm.breakdown_before) | set(hbm.breakdown_after), key=lambda k: -hbm.breakdown_before.get(k, 0))
    return [(k, hbm.breakdown_before.get(k, 0), hbm.breakdown_after.get(k, 0)) for k in keys]


def placement_text(plan: Plan, index: int) -> str:
    """A placement, ready to paste: the torch call when the manifest named it, then the HLO edits."""
    p = plan.placements[index]
    lines = []
    if p.torch is not None:
        spec = ", ".join(repr(tuple(a)) if isinstance(a, list) else repr(a) for a in p.torch.partition_spec)
        lines.append("# inside the scanned layer function (torch_xla.distributed.spmd as xs)")
        lines.append(f"xs.{p.torch.call}(layer.{p.torch.parameter}, mesh, ({spec},))")
    for a in p.annotations:
        if a.shard_as is not None:
            lines.append(f"// {a.computation}: put {a.instruction} in shard_as group {a.shard_as}")
        else:
            dims = ",".join(map(str, a.unspecified_dims))
            config = f', backend_config="unspecified_dims=[{dims}]"' if a.unspecified_dims else ""
            lines.append(f"// {a.computation}: after {a.instruction}")
            lines.append(f'%{a.instruction}.pinned = custom-call(%{a.instruction}), custom_call_target="Sharding", '
                         f"sharding={a.sharding}{config}")  # fmt: skip
    return "\n".join(lines)

"""What the dashboard draws, computed here so the templates only place it.

Numbers become geometry (bar heights, grid colours) in Python; every string
that came from the HLO (names, metadata, source paths) reaches the page only
through the templates, which escape it.

The page stays one screen wide and a few screens tall at any chip count: chips
with the same numbers are one line ("all 256 chips: 712.1 GiB"), the bar chart
has a bar pair per chip up to 16 chips and one per distinct value (or min,
median and max) beyond, and the mesh is one heat map whose cells shrink to fit
about 600 px. Chip ids are written as ranges, never listed one by one.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from planner.plan.chip_groups import chip_groups, chips_text
from planner.plan.fixes.placements import PIN_OUTPUT
from planner.plan.fixes.user_form import torch_xla_code
from planner.plan.model import Plan
from planner.units import format_bytes

CHART_WIDTH = 640
CHART_HEIGHT = 260
_MARGIN_LEFT = 72
_MARGIN_BOTTOM = 28
_MARGIN_TOP = 16
_MARGIN_RIGHT = 120  # room for the capacity label beside its line
# Up to this many chips the chart has a bar pair per chip; beyond, one per distinct value or summary.
MAX_CHIP_BARS = 16
# At most this many distinct (before, after) values are drawn as a histogram; more become min/median/max.
MAX_VALUE_BARS = 8
MESH_BOX = 600  # the mesh heat map fits a square of this many pixels
_MAX_CELL = 72
_LABELLED_CELL = 48  # cells at least this big carry their chip id and bytes as text
_BAND_GAP = 8


def human_bytes(n: int | None) -> str:
    return "-" if n is None else format_bytes(n)


@dataclass(frozen=True)
class Bar:
    label: str  # a chip id, "256 chips", or min / median / max
    title: str  # what the bar's tooltip says it is
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
    per_chip: bool  # a bar pair per chip (else per distinct value, or min / median / max)
    bars: list[Bar]
    ticks: list[Tick]
    capacity_y: float | None
    capacity_label: str
    over_before: str  # the chips over capacity before the plan, as ranges ("" when none)
    over_after: str
    note: str  # what the bars are, when they are not one per chip


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
    bottom = CHART_HEIGHT - _MARGIN_BOTTOM

    def y(value: int) -> float:
        return bottom - plot_h * value / top

    kind, values = _bar_values(plan)
    per_chip = kind == "chip"
    slot = plot_w / max(len(values), 1)
    bar_w = max(min(slot * 0.38, 48), 1.0)
    bars = []
    for i, (label, title, b, a) in enumerate(values):
        x = _MARGIN_LEFT + i * slot + slot / 2 - bar_w
        over_b = capacity is not None and b > capacity
        over_a = capacity is not None and a > capacity
        bars.append(Bar(label, title, x, bar_w, y(b), bottom - y(b), y(a), bottom - y(a), b, a, over_b, over_a))
    step = nice_step(top / 4)
    ticks = [Tick(y(int(k * step)), human_bytes(int(k * step))) for k in range(int(top // step) + 1)]
    over_before = [c for c in chips if capacity is not None and hbm.per_chip_before[c] > capacity]
    over_after = [c for c in chips if capacity is not None and hbm.per_chip_after.get(c, 0) > capacity]
    note = {
        "chip": "",
        "value": f"{len(chips):,} chips: a bar pair per distinct value, labelled with how many chips hold it",
        "summary": f"{len(chips):,} chips in more than {MAX_VALUE_BARS} distinct values: the emptiest, the median "
        "and the fullest chip",
    }[kind]
    return HbmChart(
        width=CHART_WIDTH,
        height=CHART_HEIGHT,
        plot_left=_MARGIN_LEFT,
        plot_right=CHART_WIDTH - _MARGIN_RIGHT,
        plot_bottom=bottom,
        per_chip=per_chip,
        bars=bars,
        ticks=ticks,
        capacity_y=y(capacity) if capacity is not None and on_scale else None,
        capacity_label=_capacity_label(capacity, peak, on_scale),
        over_before=chips_text(over_before, len(chips)) if over_before else "",
        over_after=chips_text(over_after, len(chips)) if over_after else "",
        note=note,
    )


def _bar_values(plan: Plan) -> tuple[str, list[tuple[str, str, int, int]]]:
    """What the bars are ("chip", "value" or "summary"), and (label, title, before, after) per bar pair."""
    hbm = plan.hbm
    chips = sorted(hbm.per_chip_before, key=int)
    after = {c: hbm.per_chip_after.get(c, hbm.per_chip_before[c]) for c in chips}
    if len(chips) <= MAX_CHIP_BARS:
        return "chip", [(c, f"chip {c}", hbm.per_chip_before[c], after[c]) for c in chips]
    groups = chip_groups(plan)
    if len(groups) <= MAX_VALUE_BARS:
        return "value", [(f"{g.count:,} chip{'s' if g.count > 1 else ''}", g.label, g.before_bytes, g.after_bytes)
                         for g in sorted(groups, key=lambda g: (g.before_bytes, g.after_bytes))]  # fmt: skip
    # Before and after are ranked apart: the emptiest chip after the plan need not be the emptiest before.
    before, later = sorted(hbm.per_chip_before.values()), sorted(after.values())
    return "summary", [
        ("min", "the emptiest chip", before[0], later[0]),
        ("median", "the median chip", statistics.median_low(before), statistics.median_low(later)),
        ("max", "the fullest chip", before[-1], later[-1]),
    ]


def _capacity_label(capacity: int | None, peak: int, on_scale: bool) -> str:
    if capacity is None:
        return ""
    if on_scale:
        return f"capacity {human_bytes(capacity)}"
    return f"capacity {human_bytes(capacity)} is off the top of this chart: the fullest chip uses {peak / capacity:.1%}"


def nice_step(raw: float) -> float:
    power = 2 ** math.floor(math.log2(max(raw, 1)))
    return float(power if raw / power < 1.5 else power * 2)


@dataclass(frozen=True)
class Cell:
    chip: str
    x: float
    y: float
    before_bytes: int
    after_bytes: int
    before_fill: str
    after_fill: str
    over_before: bool
    over_after: bool


@dataclass(frozen=True)
class MeshGrid:
    """One heat map of the mesh, its cells coloured before and after the plan (the page switches)."""

    width: int
    height: int
    cell: int  # pixels per chip
    labelled: bool  # cells big enough for their chip id and bytes
    cells: list[Cell]
    axes: str
    layout: str  # how the mesh is laid out, when it is folded to fit
    scale: str  # what full red means


def mesh_grid(plan: Plan) -> MeshGrid:
    """The mesh as a grid of chips (first axis down, the rest across), coloured by predicted HBM use.

    Cells shrink so the grid fits `MESH_BOX` pixels. A mesh far longer one way than the other (a
    1-D mesh of 256, or fsdp=256,tp=4) is folded into bands laid side by side (or one above
    another) until it is roughly square: 256 chips in a row become 16 rows of 16 cells.
    """
    chips = sorted(plan.hbm.per_chip_before, key=int)
    count = len(chips)
    rows = _mesh_sizes(plan.mesh, count)[0]
    cols = max(count // max(rows, 1), 1)
    names = [part.split("=")[0] for part in plan.mesh.split(",")] if plan.mesh else ["devices"]
    axes = f"{' x '.join(names)} across" if rows == 1 else f"{names[0]} down, {' x '.join(names[1:])} across"
    down = rows >= cols  # the long side is down: bands of rows, side by side; else bands of columns, stacked
    long_side, short_side = (rows, cols) if down else (cols, rows)
    band_len = math.ceil(long_side / max(1, round(math.sqrt(long_side / short_side))))
    bands = math.ceil(long_side / band_len)
    gaps = (bands - 1) * _BAND_GAP
    across, along = (cols * bands, band_len) if down else (band_len, rows * bands)
    hgaps, vgaps = (gaps, 0) if down else (0, gaps)
    cell = max(2, min(_MAX_CELL, (MESH_BOX - hgaps) // across, (MESH_BOX - vgaps) // along))
    capacity = plan.hbm.capacity_bytes
    reference = capacity or max([*plan.hbm.per_chip_before.values(), *plan.hbm.per_chip_after.values(), 1])
    cells = []
    for k, c in enumerate(chips):
        r, col = divmod(k, cols)
        if down:
            band, r = divmod(r, band_len)
            x, y = band * (cols * cell + _BAND_GAP) + col * cell, r * cell
        else:
            band, col = divmod(col, band_len)
            x, y = col * cell, band * (rows * cell + _BAND_GAP) + r * cell
        before = plan.hbm.per_chip_before[c]
        after = plan.hbm.per_chip_after.get(c, before)
        over_before, over_after = capacity is not None and before > capacity, capacity is not None and after > capacity
        cells.append(Cell(c, x, y, before, after, _heat(before / reference), _heat(after / reference),
                          over_before, over_after))  # fmt: skip
    width = across * cell + hgaps
    height = along * cell + vgaps
    layout = ""
    if bands > 1:
        if rows == 1:
            layout = f"chips in rows of {band_len}"
        elif down:
            layout = f"{names[0]} folded into {bands} bands of {band_len}, side by side"
        else:
            layout = f"{' x '.join(names[1:])} folded into {bands} bands of {band_len}, one above another"
    full = "the chip's capacity" if capacity else "the fullest chip"
    return MeshGrid(width, height, cell, cell >= _LABELLED_CELL, cells, axes, layout,
                    f"green: empty, red: {human_bytes(reference)} ({full})")  # fmt: skip


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


def change_set(plan: Plan) -> list[str]:
    """The verdict's change set, placement by placement (in the user's words where the plan has them, else
    by summary, else id), unless its name lists them."""
    if plan.verdict is None:
        return []
    summaries = {p.id: p.in_words for p in plan.placements}
    listed = [summaries.get(pid, pid) for pid in plan.verdict.change_set]
    return [] if any(s in plan.verdict.change_set_name for s in listed) else listed


def placement_code(plan: Plan, index: int) -> str | None:
    """A placement as the line to paste in the step's framework, with where it goes as a comment."""
    user = plan.placements[index].user
    if user is None or user.code is None:
        return None
    return f"# {user.where}\n{user.code}"


def placement_text(plan: Plan, index: int) -> str:
    """A placement's HLO edits, ready to paste (with the torch call first when a manifest named it and no
    framework line could be written)."""
    p = plan.placements[index]
    lines = []
    if p.torch is not None and (p.user is None or p.user.code is None):
        # The manifest's spec, where the plan's could not be put over the mesh; no line where the manifest's
        # name reaches no attribute of the model.
        output = p.kind == PIN_OUTPUT
        code = torch_xla_code(p.torch.parameter, p.torch.partition_spec, output)
        if code is not None:
            where = "after backward" if output else "inside the scanned layer function"
            lines.append(f"# {where} (torch_xla.distributed.spmd as xs)")
            lines.append(code)
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

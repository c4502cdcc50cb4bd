"""The split picture as SVG: each tensor a row of boxes, one per dim, coloured by the mesh axis the dim is
split over and labelled with its size and axes (`1024` over `tp x2`); a dim split over nothing is grey.

A finding draws its buffer now and after the plan; its root cause draws the op's operands and result, so a
dot that contracts the fsdp-split dim and returns a result split over tp only reads at a glance. Counts are
written, not drawn chip by chip, so the picture reads the same at 8 chips and at 256.
"""

from __future__ import annotations

from html import escape

from markupsafe import Markup

from planner.plan.model import FindingInfo, TensorSplitInfo

# One colour per mesh axis, in mesh order (major first); more than four axes reuse them.
AXIS_COLOURS = ("#3b6fd8", "#d9822b", "#2e9d6a", "#a24fc1")
UNSPLIT = "#e4e7ee"
ROW = 32
BOX = 122
LABEL = 190
NOTE = 350


def _mesh_axes(mesh: str) -> dict[str, int]:
    sizes = {}
    for part in mesh.split(","):
        name, _, size = part.partition("=")
        sizes[name] = int(size) if size.isdigit() else 0
    return sizes


def _row(y: int, label: str, t: TensorSplitInfo, sizes: dict[str, int]) -> list[str]:
    order = list(sizes)
    out = [f'<text x="0" y="{y + 18}" class="split-label">{escape(label)} <tspan class="split-name">'
           f"{escape(t.name[:20])}</tspan></text>"]  # fmt: skip
    for k, d in enumerate(t.dims):
        x = LABEL + k * (BOX + 4)
        named = [a for a in d.axes if a in sizes]
        colour = AXIS_COLOURS[order.index(named[0]) % len(AXIS_COLOURS)] if named else UNSPLIT
        ink = "split-on" if named else "split-off"
        over = " ".join(f"{a} x{sizes[a]}" if a in sizes else a for a in d.axes)
        out.append(f'<rect x="{x}" y="{y}" width="{BOX}" height="{ROW - 6}" rx="4" fill="{colour}"/>')
        text = f"{d.size} {over}" if over else str(d.size)
        out.append(f'<text x="{x + 6}" y="{y + 18}" class="{ink}">{escape(text)}</text>')
    x = LABEL + len(t.dims) * (BOX + 4) + 6
    copies = f"; copies over {', '.join(t.replicated_over)}" if t.replicated_over else ""
    per_chip = f"[{','.join(map(str, t.shard_shape))}] per chip{copies}"
    out.append(f'<text x="{x}" y="{y + 18}" class="split-note">{escape(per_chip)}</text>')
    return out


def _svg(rows: list[tuple[str, TensorSplitInfo]], mesh: str, title: str) -> Markup:
    sizes = _mesh_axes(mesh)
    width = LABEL + max(len(t.dims) for _, t in rows) * (BOX + 4) + NOTE
    height = ROW * len(rows) + 4
    body = [line for k, (label, t) in enumerate(rows) for line in _row(k * ROW + 2, label, t, sizes)]
    return Markup(
        f'<svg class="split" viewBox="0 0 {width} {height}" width="{width}" role="img" '
        f'aria-label="{escape(title)}" preserveAspectRatio="xMinYMin meet">'
        f"<title>{escape(title)}</title>{''.join(body)}</svg>"
    )


def finding_split_svg(f: FindingInfo) -> Markup | None:
    """The buffer's split now and after the plan."""
    if f.split is None:
        return None
    rows = [("now", f.split.now)] + ([("planned", f.split.planned)] if f.split.planned is not None else [])
    return _svg(rows, f.split.mesh, f"how {f.split.now.name} is split over mesh {f.split.mesh}")


def root_cause_svg(f: FindingInfo) -> Markup | None:
    """The op that loses an axis: its operands and its result, each dim with its axes."""
    cause = f.root_cause
    if cause is None or cause.result is None or not cause.operands or f.split is None:
        return None
    joint = "·" if cause.opcode in ("dot", "convolution") else ","
    rows = [(f"{joint} operand" if k else "operand", o) for k, o in enumerate(cause.operands)]
    rows.append((f"→ {cause.opcode}", cause.result))
    dropped = ", ".join(cause.dropped_axes) or "an axis"
    return _svg(rows, f.split.mesh, f"{cause.instruction} ({cause.opcode}) drops {dropped}")

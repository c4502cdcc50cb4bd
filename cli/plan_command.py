"""`spmd-planner plan FILE --mesh fsdp=4,tp=2 [--chip v6e | --hbm BYTES] [--manifest M.json] [--verify]
[--json] [--write-patched OUT.hlo]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cli.arguments import add_module_mesh_and_capacity, bytes_arg, capacity_of, source_name
from cli.terminal_progress import terminal_progress
from planner.data import DEFAULT_DUMP
from planner.hlo.text.parser import parse_hlo, read_hlo_text
from planner.hlo.text.printer import print_module
from planner.passes import Planning, Preparation
from planner.plan.chip_groups import chip_groups
from planner.plan.diagnosis.split_picture import split_art
from planner.plan.manifest import Manifest
from planner.plan.model import Plan
from planner.progress import note
from planner.units import format_bytes

# Chip groups with distinct numbers printed one per line; the rest are counted.
MAX_CHIP_GROUPS = 4
# The exit status of a plan printed whole whose --verify compiled nothing (see `cli.main`).
NOT_VERIFIED = 3


def register(sub: Any) -> None:
    p = sub.add_parser("plan", help="find under-sharded buffers, their root cause, and the annotations that fix them")
    add_module_mesh_and_capacity(p)
    p.add_argument("--manifest", type=Path, help="JSON: output names and parameter partition specs from the client")
    p.add_argument("--threshold", type=float, default=1.5, help="report buffers above this multiple of their ideal")
    p.add_argument("--min-bytes", type=bytes_arg, default=1 << 20, help="and wasting at least this much per chip")
    p.add_argument("--verify", action="store_true",
                   help="compile original and patched module with real XLA; when it cannot (a module the installed "
                   "jaxlib cannot read, no compiler installed), the plan is printed with why, and the exit status is "
                   f"{NOT_VERIFIED}")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--every-chip", action="store_true",
                   help="with --json: bytes per chip one entry per chip (default: one per distinct value)")  # fmt: skip
    p.add_argument("--write-patched", type=Path, metavar="OUT.hlo", help="write the module with the placements")
    p.set_defaults(run=run)


def read_manifest(path: Path) -> Manifest:
    try:
        return Manifest.model_validate_json(path.read_text())
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: the manifest is not UTF-8 JSON text ({e.reason} at byte {e.start})") from None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise ValueError(f"{path}: manifest field {where}: {first['msg']}") from None


def run(args: argparse.Namespace) -> int:
    path: Path = args.file or DEFAULT_DUMP
    module = parse_hlo(read_hlo_text(path), source=source_name(path))
    capacity = capacity_of(args)
    manifest = read_manifest(args.manifest) if args.manifest else None
    # A chip preset predicts that chip's compiler (its pipeline and its memory); without one, XLA:CPU's.
    with terminal_progress():
        note(f"preparing the module as {args.chip or 'cpu'}'s compiler takes it")
        prepared = Preparation(args.chip or "cpu", args.mesh, libtpu=args.libtpu).apply(module)
        plan, patched = Planning(capacity, args.threshold, args.min_bytes, manifest, args.verify).apply(prepared)
    if args.write_patched:
        try:
            args.write_patched.write_text(print_module(patched))
        except OSError as e:
            raise ValueError(f"cannot write {args.write_patched}: {e.strerror}") from None
        chosen = sum(1 for p in plan.placements if p.recommended)
        print(f"wrote the patched module ({chosen} placements) to {args.write_patched}", file=sys.stderr)
    for warning in plan.warnings:
        print(f"spmd-planner: warning: {warning}", file=sys.stderr)
    every_chip = {"every_chip": args.every_chip}
    print(plan.model_dump_json(indent=1, context=every_chip) if args.json else render_plan(plan))
    if plan.verify_not_run is None:
        return 0
    if args.json:
        # The text plan ends with this line; JSON carries it in `verify_not_run`, which a terminal does not show.
        print(f"spmd-planner: not verified: {plan.verify_not_run.reason}", file=sys.stderr)
    return NOT_VERIFIED


def render_plan(plan: Plan) -> str:
    lines = [f"plan for {plan.module}" + (f" on mesh {plan.mesh}" if plan.mesh else "")]
    lines.extend(_render_verdict(plan))
    if plan.partitioner != "gspmd":
        by = f", by the rules of {plan.shardy_release}" if plan.shardy_release else ""
        lines.append(f"  partitioner: {plan.partitioner}{by}")
    lines.extend(_render_next_steps(plan))
    for loop in plan.loops:
        trips = f"{loop.trip_count} trips" if loop.trip_count is not None else "trips unknown"
        lines.append(
            f"  loop {loop.name}: {trips}, {loop.tuple_arity}-tuple, {format_bytes(loop.carried_bytes_per_device)}"
        )
    lines.append(f"  findings: {len(plan.findings)}")
    for f in plan.findings:
        after = (
            f", {format_bytes(f.per_device_bytes_after)} after the plan" if f.per_device_bytes_after is not None else ""
        )
        where = f"{f.name} ({f.loop}[{f.index}])" if f.name else f"{f.loop}[{f.index}]"
        shard = f" -> [{','.join(map(str, f.shard_shape))}] per chip" if f.shard_shape is not None else ""
        lines.append(
            f"    [{f.kind}] {where} {f.shape}{shard}: {format_bytes(f.per_device_bytes)}, ideal "
            f"{format_bytes(f.ideal_per_device_bytes)} ({f.per_device_bytes / max(f.ideal_per_device_bytes, 1):.1f}x), "
            f"wastes {format_bytes(f.waste_bytes)}{after}"
        )
        parameter = f" (parameter {f.matched_parameter})" if f.matched_parameter else ""
        lines.append(f"      now {f.current_sharding}; ideal {f.ideal_sharding or 'an even split'}{parameter}")
        if f.split is not None:
            lines.append(f"      split over mesh {f.split.mesh}:")
            rows = [("now", f.split.now)] + ([("planned", f.split.planned)] if f.split.planned is not None else [])
            lines.extend(f"        {row}" for row in split_art(rows))
        if f.root_cause is not None:
            cause = f.root_cause
            dropped = ", ".join(cause.dropped_axes) or "an axis"
            lines.append(f"      root cause: {cause.instruction} ({cause.opcode}) drops {dropped}: {cause.notation}")
            if cause.source:
                lines.append(f"        at {cause.source}")
            if cause.result is not None and cause.operands:
                joint = "." if cause.opcode in ("dot", "convolution") else ","
                drawn = [(joint if k else "", o) for k, o in enumerate(cause.operands)] + [("->", cause.result)]
                lines.extend(f"        {row}" for row in split_art(drawn))
        if f.compiler_only is not None:
            lines.append(f"      {f.compiler_only}")
    if plan.conflicts:
        lines.append(f"  shard_as groups in conflict: {len(plan.conflicts)}")
        for c in plan.conflicts:
            lines.append(
                f"    group {c.group}: {len(c.members)} members want {len({m.wanted for m in c.members})} "
                f"different shardings"
            )
            for m in c.members:
                lines.append(f"      {m.instruction}: wants {m.wanted}, forced to {m.forced}")
    lines.append(f"  placements: {len(plan.placements)}")
    for p in plan.placements:
        mark = "in the change set" if p.recommended else "alternative, not recommended"
        user = p.user
        if user is not None:
            lines.append(f"    [{mark}] {user.summary}")
            if user.code is not None:
                lines.append(f"      {user.framework}: {user.code}")
            lines.append(f"        {user.where}")
            if user.missing is not None:
                lines.append(f"        no {user.framework} line: {user.missing}")
        else:
            lines.append(f"    [{mark}] {p.summary}" + (f" ({', '.join(p.names)})" if p.names else ""))
        lines.append(f"      {p.why}")
        if user is not None:
            lines.append(f"      hlo: {p.summary}")
        for a in p.annotations:
            if a.shard_as is not None:
                lines.append(f"      hlo: {a.instruction} in {a.computation} -> shard_as group {a.shard_as}")
            else:
                dims = f", unspecified_dims={a.unspecified_dims}" if a.unspecified_dims else ""
                lines.append(f"      hlo: Sharding {a.sharding}{dims} after {a.instruction} in {a.computation}")
    for alt in plan.alternatives:
        mark = "the change set" if alt.recommended else "alternative, not recommended"
        lines.append(f"  [{mark}] {alt.name}: {format_bytes(alt.predicted_total)} per chip; {alt.why}")
    lines.extend(_render_verification(plan))
    return "\n".join(lines)


def _render_verdict(plan: Plan) -> list[str]:
    """Fits or not, before and after, the change set and what it buys; then HBM per chip, chips collapsed."""
    hbm = plan.hbm
    lines = []
    v = plan.verdict
    if v is not None:
        lines.append(f"  verdict: {v.summary}")
        saves = f"saves {format_bytes(v.saves_bytes)} per chip (worst chip)"
        chosen = [p for p in plan.placements if p.id in v.change_set]
        if len(chosen) > 1 and not any(a.recommended for a in plan.alternatives):
            # A change set of several named placements reads one per line.
            lines.append(f"  recommended: {len(chosen)} placements; {saves}")
            lines.extend(f"    {p.in_words}" for p in chosen)
        else:
            lines.append(f"  recommended: {v.change_set_name}; {saves}")
    capacity = f" of {format_bytes(hbm.capacity_bytes)}" if hbm.capacity_bytes else ""
    compiler = "" if hbm.backend == "cpu" else f", as {hbm.backend}'s compiler allocates it"
    lines.append(
        f"  HBM per chip: {format_bytes(hbm.total_before)} -> {format_bytes(hbm.total_after)}{capacity} "
        f"(saves {format_bytes(hbm.total_before - hbm.total_after)}{compiler})"
    )
    if hbm.host_before or hbm.host_after:
        lines.append(
            f"  host memory per chip (offloaded, not HBM): {format_bytes(hbm.host_before)} -> "
            f"{format_bytes(hbm.host_after)}"
        )
    groups = chip_groups(plan)
    shown = groups[:MAX_CHIP_GROUPS]
    for g in shown:
        over = " (over capacity after the plan)" if g.over_after else " (over capacity before)" if g.over_before else ""
        lines.append(f"    {g.label}: {format_bytes(g.before_bytes)} -> {format_bytes(g.after_bytes)}{over}")
    if len(groups) > len(shown):
        rest = sum(g.count for g in groups[len(shown) :])
        lines.append(f"    {rest:,} more chips in {len(groups) - len(shown)} groups, each below those shown")
    return lines


def _render_next_steps(plan: Plan) -> list[str]:
    """What holds the peak and the predicted options, when sharding alone does not make the step fit."""
    lines = []
    if plan.peak_holders:
        lines.append("  at the peak after the plan, per chip:")
        for h in plan.peak_holders:
            lines.append(f"    {h.kind}: {format_bytes(h.per_device_bytes)}")
            lines.extend(f"      {item}" for item in h.items)
    if plan.next_steps or plan.next_steps_unavailable:
        lines.append("  next steps beyond sharding (each predicted on top of the plan):")
        for step in plan.next_steps:
            fits = "" if step.fits is None else (", fits" if step.fits else ", does not fit")
            lines.append(f"    [{step.kind}] {format_bytes(step.predicted_total)} per chip{fits}")
            lines.append(f"      {step.summary}")
        lines.extend(f"    [not predicted] {why}" for why in plan.next_steps_unavailable)
    return lines


def _render_verification(plan: Plan) -> list[str]:
    if plan.verify_not_run is not None:
        return [f"  not verified: {plan.verify_not_run.reason}"]
    v = plan.verification
    if v is None:
        return []
    lines = [f"  verified with {v.xla} in {v.seconds:.1f} s:"]
    predicted = ""
    if v.predicted_before_bytes is not None and v.predicted_after_bytes is not None:
        predicted = (
            f"; predicted {format_bytes(v.predicted_before_bytes)} -> {format_bytes(v.predicted_after_bytes)} "
            f"(saves {format_bytes(v.predicted_saving_bytes)})"
        )
    lines.append(
        f"    XLA:CPU bytes per device {format_bytes(v.before_total_bytes)} -> {format_bytes(v.after_total_bytes)} "
        f"(saves {format_bytes(v.xla_saving_bytes)}){predicted}{_as_given(v.given_total_bytes, v.before_total_bytes)}"
    )
    if v.gradient_check is not None:
        lines.append(f"    stacked gradients not checked: {v.gradient_check}")
    elif v.stacked_gradients_at_shard:
        lines.append("    every stacked gradient at its shard")
    else:
        lines.append("    stacked gradients XLA:CPU keeps larger than their shard with the plan applied:")
        lines.extend(f"      {m}" for m in v.gradient_mismatches)
    if v.tpu is not None:
        tpu_predicted = ""
        if v.tpu.predicted_before_bytes is not None and v.tpu.predicted_after_bytes is not None:
            tpu_predicted = (
                f"; predicted {format_bytes(v.tpu.predicted_before_bytes)} -> "
                f"{format_bytes(v.tpu.predicted_after_bytes)}"
            )
        lines.append(
            f"    {v.tpu.xla}: bytes per chip {format_bytes(v.tpu.before_total_bytes)} -> "
            f"{format_bytes(v.tpu.after_total_bytes)} (saves {format_bytes(v.tpu.xla_saving_bytes)}){tpu_predicted}"
            f"{_as_given(v.tpu.given_total_bytes, v.tpu.before_total_bytes)}"
        )
    if v.tpu_skipped is not None:
        lines.append(f"    XLA:TPU not verified: {v.tpu_skipped}")
    if plan.withdrawn is not None:
        lines.append(f"    recommendation withdrawn: {plan.withdrawn}")
    elif v.confirmed and v.gradient_mismatches:
        # The bytes are saved, and not every gradient is at its shard: both are said, neither overrides the other.
        lines.append(
            f"    the compiler the plan is for confirms the saving, short of the {len(v.gradient_mismatches)} "
            "stacked gradients above, which stay larger than their shard"
        )
    elif v.confirmed:
        lines.append("    the compiler the plan is for confirms the saving")
    return lines


def _as_given(given: int | None, inlined: int) -> str:
    """The module as given, where the compiler allocates it more than 1% differently from its inlined form."""
    if given is None or abs(given - inlined) <= 0.01 * inlined:
        return ""
    return f"; as given (calls not inlined) {format_bytes(given)}"

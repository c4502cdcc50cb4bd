"""`spmd-planner plan FILE --mesh fsdp=4,tp=2 [--chip v6e | --hbm BYTES] [--manifest M.json] [--verify]
[--json] [--write-patched OUT.hlo]`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.cli.arguments import add_module_mesh_and_capacity, bytes_arg, capacity_of
from planner.data import DEFAULT_DUMP
from planner.hlo.parser import parse_hlo, read_hlo_text
from planner.hlo.printer import print_module
from planner.plan.manifest import Manifest
from planner.plan.model import Plan
from planner.plan.planner import make_plan


def register(sub: Any) -> None:
    p = sub.add_parser("plan", help="find under-sharded buffers, their root cause, and the annotations that fix them")
    add_module_mesh_and_capacity(p)
    p.add_argument("--manifest", type=Path, help="JSON: output names and parameter partition specs from the client")
    p.add_argument("--threshold", type=float, default=1.5, help="report buffers above this multiple of their ideal")
    p.add_argument("--min-bytes", type=bytes_arg, default=1 << 20, help="and wasting at least this much per chip")
    p.add_argument("--verify", action="store_true", help="compile original and patched module with real XLA")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--write-patched", type=Path, metavar="OUT.hlo", help="write the module with the placements")
    p.set_defaults(run=run)


def read_manifest(path: Path) -> Manifest:
    try:
        return Manifest.model_validate_json(path.read_text())
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise ValueError(f"{path}: manifest field {where}: {first['msg']}") from None


def run(args: argparse.Namespace) -> int:
    path: Path = args.file or DEFAULT_DUMP
    module = parse_hlo(read_hlo_text(path), source=str(path))
    capacity = capacity_of(args)
    manifest = read_manifest(args.manifest) if args.manifest else None
    plan, patched = make_plan(
        module,
        args.mesh,
        capacity,
        threshold=args.threshold,
        min_bytes=args.min_bytes,
        manifest=manifest,
        verify=args.verify,
        chip_name=args.chip,
    )
    if args.write_patched:
        args.write_patched.write_text(print_module(patched))
    print(plan.model_dump_json(indent=1) if args.json else render_plan(plan))
    return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def render_plan(plan: Plan) -> str:
    hbm = plan.hbm
    lines = [f"plan for {plan.module}" + (f" on mesh {plan.mesh}" if plan.mesh else "")]
    if plan.partitioner != "gspmd":
        lines.append(f"  partitioner: {plan.partitioner}")
    capacity = f" of {_mib(hbm.capacity_bytes)}" if hbm.capacity_bytes else ""
    compiler = "" if hbm.backend == "cpu" else f", as {hbm.backend}'s compiler allocates it"
    lines.append(
        f"  HBM per chip: {_mib(hbm.total_before)} -> {_mib(hbm.total_after)}{capacity} "
        f"(saves {_mib(hbm.total_before - hbm.total_after)}{compiler})"
    )
    over = [c for c, b in hbm.per_chip_before.items() if hbm.capacity_bytes and b > hbm.capacity_bytes]
    if over:
        lines.append(f"  over capacity before the plan: chips {', '.join(over)}")
    for loop in plan.loops:
        trips = f"{loop.trip_count} trips" if loop.trip_count is not None else "trips unknown"
        lines.append(f"  loop {loop.name}: {trips}, {loop.tuple_arity}-tuple, {_mib(loop.carried_bytes_per_device)}")
    lines.append(f"  findings: {len(plan.findings)}")
    for f in plan.findings:
        after = f", {_mib(f.per_device_bytes_after)} after the plan" if f.per_device_bytes_after is not None else ""
        lines.append(
            f"    [{f.kind}] {f.loop}[{f.index}] {f.shape}: {_mib(f.per_device_bytes)} per chip, ideal "
            f"{_mib(f.ideal_per_device_bytes)} ({f.per_device_bytes / max(f.ideal_per_device_bytes, 1):.1f}x), "
            f"wastes {_mib(f.waste_bytes)}{after}"
        )
        parameter = f" (parameter {f.matched_parameter})" if f.matched_parameter else ""
        lines.append(f"      now {f.current_sharding}; ideal {f.ideal_sharding or 'an even split'}{parameter}")
        if f.root_cause is not None:
            cause = f.root_cause
            dropped = ", ".join(cause.dropped_axes) or "an axis"
            lines.append(f"      root cause: {cause.instruction} ({cause.opcode}) drops {dropped}: {cause.notation}")
            if cause.source:
                lines.append(f"        at {cause.source}")
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
        mark = "recommended" if p.recommended else "NOT recommended"
        lines.append(f"    [{mark}] {p.summary}")
        lines.append(f"      {p.why}")
        if p.torch is not None:
            lines.append(
                f"      torch: {p.torch.call}(<layer>.{p.torch.parameter}, mesh, {tuple(p.torch.partition_spec)})"
            )
        for a in p.annotations:
            if a.shard_as is not None:
                lines.append(f"      hlo: {a.instruction} in {a.computation} -> shard_as group {a.shard_as}")
            else:
                dims = f", unspecified_dims={a.unspecified_dims}" if a.unspecified_dims else ""
                lines.append(f"      hlo: Sharding {a.sharding}{dims} after {a.instruction} in {a.computation}")
    for alt in plan.alternatives:
        mark = "recommended" if alt.recommended else "NOT recommended"
        lines.append(f"  alternative [{mark}] {alt.name}: {_mib(alt.predicted_total)} per chip; {alt.why}")
    if plan.verification is not None:
        v = plan.verification
        lines.append(f"  verified with {v.xla} in {v.seconds:.1f} s:")
        lines.append(
            f"    XLA bytes per device {_mib(v.before_total_bytes)} -> {_mib(v.after_total_bytes)} "
            f"(saves {_mib(v.xla_saving_bytes)}; predicted {_mib(v.predicted_saving_bytes)})"
        )
        state = "every stacked gradient at its shard" if v.stacked_gradients_at_shard else "gradients still too large:"
        lines.append(f"    {state}")
        lines.extend(f"      {m}" for m in v.gradient_mismatches)
        if v.tpu is not None:
            lines.append(
                f"    {v.tpu.xla}: bytes per chip {_mib(v.tpu.before_total_bytes)} -> "
                f"{_mib(v.tpu.after_total_bytes)} (saves {_mib(v.tpu.xla_saving_bytes)})"
            )
    return "\n".join(lines)

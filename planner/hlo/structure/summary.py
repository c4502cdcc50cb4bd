"""A module at a glance: computations, opcodes, While loops, size."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from planner.hlo.ir.module import HloModule
from planner.hlo.structure.loops import while_loops
from planner.hlo.text.shardy_import import module_mesh, partitioner_of
from planner.units import format_bytes


@dataclass(frozen=True, slots=True)
class LoopSummary:
    name: str
    computation: str
    body: str
    condition: str
    trip_count: int | None
    trip_count_source: str | None
    tuple_arity: int
    carried_bytes: int


@dataclass(frozen=True, slots=True)
class ModuleSummary:
    name: str
    text_bytes: int
    num_computations: int
    num_instructions: int
    entry: str
    num_entry_parameters: int
    entry_parameter_bytes: int
    num_partitions: int | None
    partitioner: str  # gspmd | shardy
    mesh: str | None  # the mesh a Shardy module declares
    opcode_counts: dict[str, int]
    while_loops: tuple[LoopSummary, ...]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(module: HloModule, text_bytes: int) -> ModuleSummary:
    counts = Counter(inst.opcode for comp in module.computations for inst in comp.instructions)
    params = module.entry.parameters
    partitions = module.attr("num_partitions")
    return ModuleSummary(
        name=module.name,
        text_bytes=text_bytes,
        num_computations=len(module.computations),
        num_instructions=module.num_instructions,
        entry=module.entry_name,
        num_entry_parameters=len(params),
        entry_parameter_bytes=sum(p.shape.byte_size for p in params),
        num_partitions=partitions,
        partitioner=partitioner_of(module),
        mesh=mesh.to_text() if (mesh := module_mesh(module)) is not None else None,
        opcode_counts=dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))),
        while_loops=tuple(
            LoopSummary(
                name=loop.name,
                computation=loop.computation,
                body=loop.body,
                condition=loop.condition,
                trip_count=loop.trip_count,
                trip_count_source=loop.trip_count_source,
                tuple_arity=loop.tuple_arity,
                carried_bytes=loop.instruction.shape.byte_size,
            )
            for loop in while_loops(module)
        ),
    )


def render_summary(summary: ModuleSummary) -> str:
    lines = [
        f"module {summary.name}: {summary.text_bytes:,} bytes of text",
        f"  {summary.num_computations} computations, {summary.num_instructions} instructions, entry {summary.entry}",
        f"  entry parameters: {summary.num_entry_parameters} ({format_bytes(summary.entry_parameter_bytes)})",
    ]
    if summary.num_partitions is not None:
        lines.append(f"  num_partitions: {summary.num_partitions}")
    if summary.partitioner != "gspmd":
        lines.append(f"  partitioner: {summary.partitioner}" + (f", mesh {summary.mesh}" if summary.mesh else ""))
    lines.append(f"  while loops: {len(summary.while_loops)}")
    for loop in summary.while_loops:
        trips = (
            f"{loop.trip_count} trips ({loop.trip_count_source})"
            if loop.trip_count is not None
            else "trip count unknown"
        )
        lines.append(
            f"    {loop.name} in {loop.computation}: body {loop.body}, condition {loop.condition}, {trips}, "
            f"{loop.tuple_arity}-tuple carrying {format_bytes(loop.carried_bytes)}"
        )
    lines.append("  opcodes:")
    width = max((len(op) for op in summary.opcode_counts), default=0)
    lines.extend(f"    {op:<{width}}  {n}" for op, n in summary.opcode_counts.items())
    return "\n".join(lines)

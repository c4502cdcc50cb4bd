"""Shardy's decisions in the form every later stage reads: a `PropagationResult` over the module.

The prepared module a plan reads is the Shardy module read as GSPMD's (`planner.hlo.text.shardy_import`),
instruction for instruction and name for name, except what that reading folds away: the calls that
set a function result's sharding (gone, their operand returned) and the `shard_alike` markers (there
`Sharding` calls of their operand's shape). Every instruction of it gets the sharding Shardy leaves
the same name with; a `shard_alike` marker, which Shardy's export removes, that of its operand.
"""

from __future__ import annotations

from collections.abc import Mapping

from planner.hlo.ir.module import HloModule
from planner.propagation.shardy.program import Origin
from planner.propagation.shared.graph import Provenance
from planner.propagation.shared.result import PropagatedInstruction, PropagationResult
from planner.sharding.hlo_sharding import HloSharding


def propagation_result(
    module: HloModule, decisions: dict[str, tuple[HloSharding, Origin]], aliases: Mapping[str, str] | None = None
) -> PropagationResult:
    """`aliases`: names the prepare passes retired, each to the one that holds its value now."""
    instructions = []
    for comp in module.computations:
        for inst in comp.instructions:
            decided = decisions.get(inst.name)
            if decided is None and inst.opcode == "custom-call" and inst.operands:
                s = inst.sharding
                if s is not None and s.shard_group is not None:  # a shard_alike marker read as GSPMD's
                    decided = decisions.get(inst.operands[0])
            sharding, origin = decided if decided is not None else (None, None)
            instructions.append(
                PropagatedInstruction(
                    inst.name,
                    comp.name,
                    inst.opcode,
                    sharding,
                    Provenance(f"Shardy: {origin.reason}", origin.sources) if origin is not None else None,
                    None,
                    inst.operands,
                    inst.attr("index") if inst.opcode == "get-tuple-element" else None,
                )
            )
    return PropagationResult(tuple(instructions), dict(aliases or {}))

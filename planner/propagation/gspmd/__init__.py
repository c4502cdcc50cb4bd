"""GSPMD's sharding propagation (XLA's ShardingPropagation), simulated rule by rule.

`driver` runs the pass's fixed point over the shared graph; `forward*` infer a sharding from operands and
`backward` from users; `outputs` restores what the pass may not change; `worklist` skips visits that cannot
change anything.
"""

from __future__ import annotations

from collections.abc import Mapping

from planner.hlo.ir.module import HloModule
from planner.prepare.propagation_options import PropagationOptions
from planner.propagation.gspmd.driver import Propagator
from planner.propagation.shared.result import PropagatedInstruction, PropagationResult


def run_gspmd(module: HloModule, options: PropagationOptions, aliases: Mapping[str, str]) -> PropagationResult:
    """GSPMD's decisions on `module`; `aliases` are names earlier passes retired (old -> new)."""
    propagator = Propagator(module, options)
    propagator.run()
    instructions = tuple(
        PropagatedInstruction(
            n.name,
            n.computation,
            n.opcode,
            n.sharding,
            n.provenance,
            n.unknown_reason,
            tuple(o.name for o in n.operands),
            n.inst.attr("index") if n.opcode == "get-tuple-element" else None,
        )
        for n in propagator.graph.nodes()
    )
    # A retired name may point at a node that propagation itself renamed (a Sharding call turned copy).
    renamed = {k: propagator.renamed.get(v, v) for k, v in {**aliases, **propagator.renamed}.items()}
    propagator.graph.release()
    return PropagationResult(instructions, renamed)

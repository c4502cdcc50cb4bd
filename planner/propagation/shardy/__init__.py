"""Shardy's sharding propagation, simulated: JAX's default partitioner, by its own rules.

The engine beside GSPMD's (`planner.propagation`): the same HLO module and the same downstream, but
Shardy's state (per value a tensor sharding of axes per dim, open or closed, with priorities and
sub-axes), Shardy's per-op rules over factors (`registry`), its factor propagation (`factor_propagation`),
its worklist driver with data-flow edges, sharding groups and manual computations (`driver`,
`program`, `manual`), its op- and user-priority schedules (`schedule`) and the import and export passes
around them (`pipeline`), ending in the HloShardings XLA's partitioner reads (`export`).
"""

from __future__ import annotations

from planner.hlo.ir.module import HloModule
from planner.hlo.text.shardy_import import module_meshes
from planner.propagation.shardy.export import instruction_shardings
from planner.propagation.shardy.pipeline import run_export, run_import
from planner.propagation.shardy.program import Origin, Program, build_program
from planner.propagation.shardy.schedule import propagate
from planner.sharding.hlo_sharding import HloSharding


def run_pipeline(module: HloModule) -> Program:
    """`sdy-propagation-pipeline` as XLA runs it inside its Shardy pass: import, propagate, export."""
    program = build_program(module, module_meshes(module))
    run_import(program)
    propagate(program, "user-priority")
    run_export(program)
    return program


def shardy_shardings(module: HloModule) -> dict[str, HloSharding]:
    """Per instruction, the HloSharding Shardy leaves it with (unsharded instructions absent)."""
    return {name: sharding for name, (sharding, _) in shardy_decisions(module).items()}


def shardy_decisions(module: HloModule) -> dict[str, tuple[HloSharding, Origin]]:
    """Per instruction Shardy leaves sharded: its HloSharding and why."""
    return instruction_shardings(run_pipeline(module), module)


__all__ = ["Origin", "Program", "build_program", "propagate", "run_pipeline", "shardy_decisions", "shardy_shardings"]

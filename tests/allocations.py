"""Which values of a small HLO module the memory model gives a buffer of their own, for one compiler."""

from __future__ import annotations

from planner import parse_hlo
from planner.memory.values import ValueModel
from planner.prepare import prepare
from planner.propagation import propagate


def allocating(text: str, target: str) -> set[str]:
    """Names of the instructions whose values allocate, once `target`'s compiler has prepared the module."""
    prepared = prepare(parse_hlo(text), target)
    model = ValueModel(prepared.module, propagate(prepared), target != "cpu")
    model.build()
    return {v[1] for v in model.allocating}

"""The passes as values: registered by name, frozen, and the same work as the functions they wrap."""

from __future__ import annotations

import dataclasses

import pytest

from planner.data import DEFAULT_DUMP
from planner.hlo.inline import inline_calls
from planner.hlo.parser import parse_hlo_file
from planner.memory import estimate_memory
from planner.mesh import Mesh
from planner.passes import PASSES, MemoryEstimation, Planning, ShardingPropagation
from planner.plan.planner import make_plan
from planner.propagation import propagate


def test_every_pass_is_registered_by_its_name_and_frozen() -> None:
    assert set(PASSES) == {"sharding-propagation", "memory-estimation", "planning"}
    for cls in PASSES.values():
        assert dataclasses.is_dataclass(cls)
        value, field = cls(), dataclasses.fields(cls)[0].name
        # FrozenInstanceError is an AttributeError; a compiled frozen class raises the latter.
        with pytest.raises(AttributeError):
            setattr(value, field, getattr(value, field))


def test_passes_do_what_the_functions_do() -> None:
    module = parse_hlo_file(DEFAULT_DUMP)
    mesh = Mesh.parse("fsdp=4,tp=2")
    result = ShardingPropagation().apply(module)
    assert result.shardings() == propagate(module).shardings()
    inlined = inline_calls(module).module
    assert MemoryEstimation(mesh, "v6e").apply(inlined, result).total_bytes == (
        estimate_memory(inlined, result, mesh, "v6e").total_bytes
    )
    plan, patched = Planning(mesh, threshold=2.0).apply(module)
    expected, expected_patched = make_plan(module, mesh, threshold=2.0)
    assert plan.model_dump() == expected.model_dump() and patched == expected_patched

"""The passes as values: registered by name, frozen, and the same work as the functions they wrap."""

from __future__ import annotations

import dataclasses

import pytest

from planner.data import DEFAULT_DUMP
from planner.hlo.text.parser import parse_hlo_file
from planner.memory import estimate_memory
from planner.mesh import Mesh
from planner.passes import PASSES, MemoryEstimation, Planning, Preparation, ShardingPropagation
from planner.plan.planner import make_plan
from planner.prepare import prepare
from planner.propagation import propagate


def test_every_pass_is_registered_by_its_name_and_frozen() -> None:
    assert set(PASSES) == {"prepare", "sharding-propagation", "memory-estimation", "planning"}
    for cls in PASSES.values():
        assert dataclasses.is_dataclass(cls)
        fields = dataclasses.fields(cls)
        if not fields:  # a pass with no options has nothing to set
            continue
        value, field = cls(), fields[0].name
        # FrozenInstanceError is an AttributeError; a compiled frozen class raises the latter.
        with pytest.raises(AttributeError):
            setattr(value, field, getattr(value, field))


def test_passes_do_what_the_functions_do() -> None:
    module = parse_hlo_file(DEFAULT_DUMP)
    mesh = Mesh.parse("fsdp=4,tp=2")
    prepared = Preparation("v6e", mesh).apply(module)
    assert prepared == prepare(module, "v6e", mesh)
    result = ShardingPropagation().apply(prepared)
    assert result.shardings() == propagate(prepared).shardings()
    assert MemoryEstimation().apply(prepared, result).total_bytes == estimate_memory(prepared, result).total_bytes
    plan, patched = Planning(threshold=2.0).apply(prepared)
    expected, expected_patched = make_plan(prepared, threshold=2.0)
    assert plan.model_dump() == expected.model_dump() and patched == expected_patched

"""Shardy's decisions as the HloShardings XLA's SPMD partitioner reads.

After the export pipeline closes every dim, XLA writes each value's Shardy sharding as an HloSharding
(`planner.sharding.shardy.to_hlo_sharding`, the device order and the trailing replicated subgroup
of XLA's `convertToHloSharding`). An instruction of several results takes a tuple sharding, an
unsharded element replicated; an instruction none of whose values Shardy sharded stays unannotated,
as XLA leaves it (the partitioner then replicates it).
"""

from __future__ import annotations

from planner.hlo.ir.module import HloModule
from planner.hlo.ir.shapes import TupleShape
from planner.propagation.shardy.program import Origin, Program, Value
from planner.sharding.hlo_sharding import HloSharding
from planner.sharding.shardy import SdyMesh, to_hlo_sharding


def value_sharding(value: Value, meshes: dict[str, SdyMesh]) -> HloSharding | None:
    if value.sharding is None or value.dims is None:
        return None
    return to_hlo_sharding(value.sharding, meshes, len(value.dims))


def instruction_shardings(program: Program, module: HloModule) -> dict[str, tuple[HloSharding, Origin]]:
    """Per instruction of `module` that Shardy leaves sharded, its HloSharding and why (its first sharded
    value's last change)."""
    out: dict[str, tuple[HloSharding, Origin]] = {}
    # A constant or scalar broadcast split per use: the instruction is its copies (the export merges the
    # copies that agree); it takes the sharding of the first copy that has one.
    copies: dict[int, list[Value]] = {}
    for index, original in program.split_from.items():
        copies.setdefault(original.index, []).append(program.values[index])
    for comp in module.computations:
        for inst in comp.instructions:
            values = program.leaves.get(inst.name)
            if not values:
                continue
            values = [_with_copies(v, copies) for v in values]
            shardings = [value_sharding(v, program.meshes) for v in values]
            if all(s is None for s in shardings):
                continue
            origin = next(v.origin for v, s in zip(values, shardings, strict=True) if s is not None)
            if isinstance(inst.shape, TupleShape):
                out[inst.name] = (HloSharding.tuple_of(tuple(s or HloSharding.replicate() for s in shardings)), origin)
            else:
                first = shardings[0]
                assert first is not None
                out[inst.name] = (first, origin)
    return out


def _with_copies(value: Value, copies: dict[int, list[Value]]) -> Value:
    if value.sharding is not None:
        return value
    return next((c for c in copies.get(value.index, ()) if c.sharding is not None), value)

"""Shardy's import splits constants and scalar broadcasts per use (`constant_or_scalar_splitter.cc`).

A constant expression (a constant or iota, and any broadcast, reshape, slice or element-wise op of
constant expressions) and a broadcast of a scalar are cloned for every op that reads them, so that one
zero-filled buffer initialising two loop accumulators, or one mask read by many layers, never ties
their shardings together. Scalars themselves are shared. The clone is placed just before its user,
where the worklist meets it; the export merges clones that end up alike.
"""

from __future__ import annotations

from planner.hlo.ir.shardy_op_kinds import CONSTANT_PRESERVING
from planner.propagation.shardy.program import EDGE, RULE, Op, Program, Value


def _opcode(op: Op) -> str:
    return op.inst.opcode if op.kind == RULE and op.inst is not None else ""


def split_constants(program: Program) -> None:
    constant_ops: set[int] = set()
    expansions: set[int] = set()
    ops: list[Op] = []
    for op in program.ops:
        opcode = _opcode(op)
        if opcode in ("constant", "iota") or (
            opcode in CONSTANT_PRESERVING
            and op.operands
            and all(v.defining is not None and id(v.defining) in constant_ops for v in op.operands)
        ):
            constant_ops.add(id(op))
            ops.append(op)
            continue
        if opcode == "broadcast" and op.operands and op.operands[0].is_scalar:
            expansions.add(id(op))
            ops.append(op)
            continue
        splittable = constant_ops | expansions
        for position, value in enumerate(op.operands):
            defining = value.defining
            if defining is None or id(defining) not in splittable or value.is_scalar:
                continue
            clone = _clone(program, value, ops, splittable)
            value.uses.remove(op) if op in value.uses else value.target_uses.remove(op)
            op.operands[position] = clone
            clone.uses.append(op)
        ops.append(op)
    # A returned constant: each result its own copy, as the return op is a user like any other.
    for result in program.results:
        value = result.value
        defining = value.defining
        if defining is not None and id(defining) in constant_ops | expansions and not value.is_scalar:
            clone = _clone(program, value, ops, constant_ops | expansions)
            value.extra_uses -= 1
            clone.extra_uses += 1
            result.value = clone
    program.ops = ops


def _clone(program: Program, value: Value, ops: list[Op], splittable: set[int]) -> Value:
    if value.is_scalar:
        return value
    defining = value.defining
    assert defining is not None
    operands = [
        _clone(program, v, ops, splittable) if v.defining is not None and id(v.defining) in splittable else v
        for v in defining.operands
    ]
    results = []
    for original in defining.results:
        copy = Value(len(program.values), original.name + ".split", original.dims, original.array)
        copy.sharding = original.sharding
        copy.instruction = original.instruction
        program.values.append(copy)
        program.split_from[copy.index] = original
        results.append(copy)
    clone = Op(defining.kind, defining.name, defining.loc, operands, results, inst=defining.inst)
    for v in operands:
        v.uses.append(clone)
    for v in results:
        v.defining = clone
    ops.append(clone)
    assert defining.kind != EDGE
    return results[defining.results.index(value)]

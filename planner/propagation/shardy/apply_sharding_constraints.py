"""Shardy's `sdy-apply-sharding-constraints`: a constraint's sharding given to its input before propagation.

A fully closed sharding constraint (or a manual computation's in-sharding, which constrains its operand)
applies to its input when the input has no sharding yet and no other constraint or manual computation
asks it for a different one (`shouldApply`). How it applies depends on the input:

- an ordinary value takes the sharding itself;
- the owner of a data-flow edge (a loop's carried value, a branch's or a named computation's result or
  block argument) keeps the sharding its edge gives it: the constraint moves to right after it instead,
  and every other reader of the owner reads the constraint's result (`replaceAllUsesExcept`), so the
  sharding holds from there on. Unreduced axes do not propagate, so they go on the owner directly. A
  manual computation's operand that owns an edge gets a new constraint of its in-sharding the same way.

A chain of constraints (`%1 = constraint %0`, `%2 = constraint %1`, ... each the only reader of the last)
on an input nothing else constrains also hands the chain's tail to the input's readers that come after
it in the same computation (`getTailOfShardingConstraintChain`), the function's return excepted.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.hlo.ir.shapes import ArrayShape
from planner.propagation.shardy.program import CONSTRAINT, EDGE, Op, Program, Value
from planner.sharding.shardy import DimSharding, TensorSharding


def apply_sharding_constraints(program: Program) -> None:
    asked = _asked_shardings(program)
    for op in list(program.ops):
        if not op.is_sharding_constraint or op.results[0].sharding is None:
            continue
        _hand_chain_tail_to_readers(program, op)
        _apply(program, op.operands[0], op.results[0].sharding, asked, op, _itself(op))
    for manual in program.manual:
        for j, arg in enumerate(manual.arguments):
            for edge in _edges_of(program, arg):
                source, sharding = edge.operands[0], manual.in_shardings[j]
                _apply(program, source, sharding, asked, edge, _constraint_on(program, source, sharding))


def _itself(op: Op) -> Callable[[], Op]:
    return lambda: op


def _constraint_on(program: Program, source: Value, sharding: TensorSharding) -> Callable[[], Op]:
    return lambda: _new_constraint(program, source, sharding)


def _edges_of(program: Program, owner: Value) -> list[Op]:
    return [op for op in program.ops if op.kind == EDGE and op.results[0] is owner]


# A value as one SSA value: a loop's carried value is its result outside the loop (False) and its block
# argument inside (True), which constraints ask separately.
Reader = tuple[int, bool]


def _reader_of(value: Value, op: Op) -> Reader:
    return value.index, op in value.target_uses


def _asked_shardings(program: Program) -> dict[Reader, list[TensorSharding]]:
    """Per value, the shardings its constraints and manual computations ask of it."""
    asked: dict[Reader, list[TensorSharding]] = {}
    for op in program.ops:
        if op.is_sharding_constraint and op.results[0].sharding is not None:
            asked.setdefault(_reader_of(op.operands[0], op), []).append(op.results[0].sharding)
    for manual in program.manual:
        for j, arg in enumerate(manual.arguments):
            for edge in _edges_of(program, arg):
                asked.setdefault(_reader_of(edge.operands[0], edge), []).append(manual.in_shardings[j])
    return asked


def _should_apply(
    value: Value, reader: Op, sharding: TensorSharding, asked: dict[Reader, list[TensorSharding]]
) -> bool:
    if value.dims is None or value.sharding is not None:
        return False
    if not all(not d.is_open for d in sharding.dims):
        return False
    return all(other == sharding for other in asked.get(_reader_of(value, reader), []))


def _apply(
    program: Program,
    value: Value,
    sharding: TensorSharding,
    asked: dict[Reader, list[TensorSharding]],
    reader: Op,
    constraint_after: Callable[[], Op],
) -> None:
    if not _should_apply(value, reader, sharding, asked):
        return
    if value.defining is None or value.defining.kind != EDGE:
        value.sharding = sharding
        return
    constraint = constraint_after()
    _read_through(program, value, constraint)
    if sharding.unreduced:
        # Unreduced axes do not propagate: the owner holds them itself.
        dims = tuple(DimSharding((), is_open=True) for _ in value.dims or ())
        value.sharding = TensorSharding(sharding.mesh, dims, (), sharding.unreduced, sharding.reduction)


def _read_through(program: Program, value: Value, constraint: Op) -> None:
    """Every reader of `value` but `constraint` reads the constraint's result instead."""
    result = constraint.results[0]
    inside = constraint in value.target_uses
    # A loop's carried value is the loop's result outside it and its block argument inside: the constraint
    # reads one of them, and the readers of that one move.
    readers = value.target_uses if inside else value.uses
    moved = [op for op in readers if op is not constraint]
    for op in moved:
        op.operands = [result if v is value else v for v in op.operands]
        result.uses.append(op)
    if inside:
        value.target_uses = [constraint]
        return
    value.uses = [constraint]
    for returned in program.results:
        if returned.value is value:
            returned.value = result
            value.extra_uses -= 1
            result.extra_uses += 1


def _new_constraint(program: Program, source: Value, sharding: TensorSharding) -> Op:
    """A constraint of `sharding` on `source`, placed right after it."""
    result = program.new_value(f"{source.name}.constraint", source.array or _shape_of(source), source.instruction)
    result.sharding = sharding
    op = Op(CONSTRAINT, result.name, source.defining.loc if source.defining else source.name, [source], [result])
    source.uses.append(op)
    result.defining = op
    at = program.ops.index(source.defining) + 1 if source.defining in program.ops else 0
    program.ops.insert(at, op)
    return op


def _shape_of(value: Value) -> ArrayShape:
    return ArrayShape("f32", value.dims or ())


def _hand_chain_tail_to_readers(program: Program, head: Op) -> None:
    value = head.operands[0]
    if value.sharding is not None or (value.defining is not None and value.defining.is_sharding_constraint):
        return
    if any(op.is_sharding_constraint for op in value.uses if op is not head):
        return
    tail = head
    while len(tail.results[0].uses) == 1 and tail.results[0].uses[0].is_sharding_constraint:
        tail = tail.results[0].uses[0]
    if tail is head or any(op.is_sharding_constraint for op in tail.results[0].uses):
        return
    result = tail.results[0]
    position = {id(op): k for k, op in enumerate(program.ops)}
    after = [
        op
        for op in value.uses
        if op is not head and op.computation is tail.computation and position[id(op)] > position[id(tail)]
    ]
    for op in after:
        op.operands = [result if v is value else v for v in op.operands]
        value.uses.remove(op)
        result.uses.append(op)

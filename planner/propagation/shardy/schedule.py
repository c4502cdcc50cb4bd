"""The order Shardy propagates in: user priorities around op priorities around one strategy.

Op priority (`op_priority_propagation.cc`) runs the aggressive strategy five times, each with a wider
filter on which ops may propagate in which direction (step p allows the union of filters 0..p):

0. element-wise ops, reshape, transpose, data-flow edges and host-offload calls, in both directions,
   but only where no non-scalar operand has another use; dynamic-slice and dynamic-update-slice
   forward only, on the same condition;
1. the same regardless of other uses;
2. every op along its pass-through factors only, a broadcast backward only;
3. every factor, a broadcast backward only;
4. everything.

So loop carries, reshapes and element-wise chains settle first, a dot's non-contracting dims join at
step 2 and its contracting (reduction) factor at step 3.

User priority (`user_priority_propagation.cc`): dims annotated `p1`, `p2`, ... start closed and empty
with their axes replicated; after a first op-priority propagation, each priority in turn restores its
dims to what the user wrote and propagates again. Dims without a priority count as `p0`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from planner.propagation.shardy.driver import STRATEGIES, Propagation, is_elementwise, rule_of, sync_groups
from planner.propagation.shardy.factor_propagation import Direction
from planner.propagation.shardy.program import EDGE, FuncResult, Op, Program, Value
from planner.propagation.shardy.rule import FactorType
from planner.propagation.shardy.sharding_group_import import unify_sharding_groups
from planner.sharding.shardy import AxisRef, DimSharding, TensorSharding

OFFLOAD_TARGETS = frozenset({"MoveToHost", "MoveToDevice"})


def _use_count(value: Value, op: Op) -> int:
    uses = value.target_uses if op in value.target_uses else value.uses
    return len(uses) + value.extra_uses


def _uses_direction(op: Op, allow_multi_use: bool) -> Direction:
    if allow_multi_use:
        return Direction.BOTH
    for value in op.operands:
        if not value.is_scalar and _use_count(value, op) != 1:
            return Direction.NONE
    return Direction.BOTH


def _pass_through(op: Op, allow_multi_use: bool) -> Direction:
    inst = op.inst
    opcode = inst.opcode if inst is not None and op.kind != EDGE else ""
    offload = opcode == "custom-call" and inst is not None and inst.attr("custom_call_target") in OFFLOAD_TARGETS
    if op.kind == EDGE:
        # The edge's one operand in Shardy is the loop result itself, used only by the edge.
        return Direction.BOTH
    if is_elementwise(op) or offload or opcode in ("reshape", "transpose"):
        return _uses_direction(op, allow_multi_use)
    if opcode in ("dynamic-slice", "dynamic-update-slice"):
        return _uses_direction(op, allow_multi_use) & Direction.FORWARD
    return Direction.NONE


def _is_broadcast(op: Op) -> bool:
    return op.kind != EDGE and op.inst is not None and op.inst.opcode == "broadcast"


def _step0(op: Op, _factor: int) -> Direction:
    return _pass_through(op, False)


def _step1(op: Op, _factor: int) -> Direction:
    return _pass_through(op, True)


def _step2(op: Op, factor: int) -> Direction:
    rule = op.rule if op.kind != EDGE else None
    if rule is not None and rule.factor_type(factor) != FactorType.PASS_THROUGH:
        return Direction.NONE
    return Direction.BACKWARD if _is_broadcast(op) else Direction.BOTH


def _step3(op: Op, _factor: int) -> Direction:
    return Direction.BACKWARD if _is_broadcast(op) else Direction.BOTH


def _step4(_op: Op, _factor: int) -> Direction:
    return Direction.BOTH


OP_PRIORITY_SCHEDULE: tuple[Callable[[Op, int], Direction], ...] = (_step0, _step1, _step2, _step3, _step4)


def _with_priority(step: int) -> Callable[[Op, int], Direction]:
    fns = OP_PRIORITY_SCHEDULE[: step + 1]

    def direction(op: Op, factor: int) -> Direction:
        out = Direction.NONE
        for fn in fns:
            out |= fn(op, factor)
        return out

    return direction


def run_strategy(
    program: Program, strategy: str, direction: Callable[[Op, int], Direction], conservative: bool, label: str = ""
) -> None:
    names = ("basic", "aggressive") if strategy == "basic-then-aggressive" else (strategy,)
    for name in names:
        Propagation(program, STRATEGIES[name], direction, conservative, label).run()


def run_op_priority(program: Program, conservative: bool = False) -> None:
    for step in range(len(OP_PRIORITY_SCHEDULE)):
        # Rules are created on first visit; step 2's filter reads them, so make sure they exist.
        for op in program.ops:
            rule_of(op, conservative, program)
        run_strategy(program, "aggressive", _with_priority(step), conservative, f"op-priority step {step}")


# --- user priorities ---------------------------------------------------------------------------


def _priority(dim: DimSharding) -> int:
    return dim.priority if dim.priority is not None else 0


def _initialized(sharding: TensorSharding) -> TensorSharding:
    dims = []
    replicated = list(sharding.replicated)
    for dim in sharding.dims:
        if _priority(dim) == 0:
            dims.append(replace(dim, priority=None))
        else:
            replicated.extend(dim.axes)
            dims.append(DimSharding((), is_open=False))
    return replace(sharding, dims=tuple(dims), replicated=tuple(replicated))


def _restored(current: TensorSharding, original: TensorSharding, priority: int) -> TensorSharding:
    dims = list(current.dims)
    seen: set[AxisRef] = set()
    for i, dim in enumerate(original.dims):
        if _priority(dim) == priority:
            dims[i] = replace(dim, priority=None)
            seen.update(dim.axes)
    replicated = tuple(a for a in current.replicated if a not in seen)
    return replace(current, dims=tuple(dims), replicated=replicated)


def run_user_priority(program: Program, conservative: bool = False) -> None:
    holders: list[Value | FuncResult] = [*program.values, *program.results]
    by_priority: dict[int, list[tuple[Value | FuncResult, TensorSharding]]] = {}
    for holder in holders:
        sharding = holder.sharding
        if sharding is None:
            continue
        priorities = {_priority(d) for d in sharding.dims} - {0}
        for p in priorities:
            by_priority.setdefault(p, []).append((holder, sharding))
        holder.sharding = _initialized(sharding)
    run_op_priority(program, conservative)
    for priority in sorted(by_priority):
        for holder, original in by_priority[priority]:
            assert holder.sharding is not None
            holder.sharding = _restored(holder.sharding, original, priority)
        run_op_priority(program, conservative)


def propagate(program: Program, pass_name: str, strategy: str = "aggressive", conservative: bool = False) -> None:
    """Runs one of Shardy's propagation passes over `program` in place."""
    unify_sharding_groups(program)
    sync_groups(program)
    if pass_name in ("basic", "aggressive"):
        run_strategy(program, strategy if pass_name == "aggressive" else "basic", _step4, conservative)
    elif pass_name == "op-priority":
        run_op_priority(program, conservative)
    elif pass_name == "user-priority":
        run_user_priority(program, conservative)
    else:
        raise ValueError(f"unknown Shardy propagation pass {pass_name!r}")

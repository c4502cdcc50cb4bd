"""Shardy's propagation driver: one greedy worklist sweep over the program per strategy and step.

Each op is visited in program order; propagating along it may change operand and result shardings,
and every change re-queues the ops that read or define the changed value (and, for a value fed to a
loop or branch, its data-flow edge). The queue is MLIR's greedy rewrite worklist: last in, first out,
and an op already queued keeps its place. Before and after the sweep the function's result shardings
are exchanged with the returned values as through an identity op. Sharding groups (`shard_alike`)
keep every member at the sharding of the last one changed. (`basic_propagation.cc` in Shardy.)
"""

from __future__ import annotations

from collections.abc import Callable

from planner.hlo.ir.shapes import ArrayShape
from planner.hlo.ir.shardy_op_kinds import SHARDY_ELEMENTWISE
from planner.propagation.shardy.factor_propagation import Direction, Update, propagate_aggressive, propagate_basic
from planner.propagation.shardy.program import (
    BARRIER,
    CONSTRAINT,
    EDGE,
    SHARDING_CONSTRAINT,
    Op,
    Origin,
    Program,
    Value,
)
from planner.propagation.shardy.projection import ShardingProjection
from planner.propagation.shardy.registry import sharding_rule
from planner.propagation.shardy.rule import OpShardingRule, pointwise_rule
from planner.sharding.shardy import DimSharding, SdyMesh, TensorSharding

Strategy = Callable[..., Update]
DirectionFn = Callable[[Op, int], Direction]


def is_elementwise(op: Op) -> bool:
    """Element-wise for the op-priority schedule and the aggressive tie-break (`isElementwise`)."""
    if op.kind in (BARRIER, CONSTRAINT):
        return True
    inst = op.inst
    if inst is None or op.kind == EDGE:
        return False
    if inst.opcode == "custom-call":
        return inst.attr("custom_call_target") == SHARDING_CONSTRAINT
    if inst.opcode == "bitcast-convert":
        return op.operands[0].dims == op.results[0].dims
    return inst.opcode in SHARDY_ELEMENTWISE


def rule_of(op: Op, conservative: bool, program: Program) -> OpShardingRule | None:
    if op.rule_known:
        return op.rule
    op.rule_known = True
    if op.kind in (EDGE, BARRIER, CONSTRAINT) or op.is_sharding_constraint:
        dims = op.results[0].dims
        op.rule = pointwise_rule(dims or (), len(op.operands), 1) if dims is not None else None
        return op.rule
    if any(v.dims is None for v in (*op.operands, *op.results)) or op.inst is None:
        return None
    operand_shapes = [v.array or ArrayShape("f32", v.dims or ()) for v in op.operands]
    result_shapes = [v.array or ArrayShape("f32", v.dims or ()) for v in op.results]
    op.rule = sharding_rule(
        op.inst,
        operand_shapes,
        result_shapes,
        conservative=conservative,
        computation=op.computation,
        release=program.release,
        module=program.module,
    )
    return op.rule


def _mesh_of(sharding: TensorSharding, meshes: dict[str, SdyMesh]) -> SdyMesh:
    return sharding.mesh if isinstance(sharding.mesh, SdyMesh) else meshes[sharding.mesh]


def common_mesh(
    shardings: list[TensorSharding | None], meshes: dict[str, SdyMesh]
) -> tuple[str | SdyMesh, SdyMesh] | None:
    """The mesh every sharded tensor of an op uses (`getCommonMeshName`); empty meshes defer to others."""
    found: tuple[str | SdyMesh, SdyMesh] | None = None
    for sharding in shardings:
        if sharding is None:
            continue
        mesh = _mesh_of(sharding, meshes)
        if found is None or _is_empty(found[1]):
            found = (sharding.mesh, mesh)
            continue
        if _is_empty(mesh):
            continue
        if mesh != found[1]:
            return None
    return found


def _is_empty(mesh: SdyMesh) -> bool:
    """`<[]>`: no axes and no device (a maximal mesh names its one device and is not empty)."""
    return not mesh.axes and not mesh.device_ids


def _all_empty(sharding: TensorSharding) -> bool:
    return all(not d.axes for d in sharding.dims)


class Propagation:
    """One run of the driver: a strategy, a direction filter and the program's state."""

    def __init__(
        self,
        program: Program,
        strategy: Strategy,
        direction: DirectionFn,
        conservative: bool = False,
        label: str = "",
    ) -> None:
        self.program = program
        self.label = label
        self.strategy_name = "basic" if strategy is propagate_basic else "aggressive"
        self.strategy = strategy
        self.direction = direction
        self.conservative = conservative
        self.group_of: dict[int, int] = {}
        for gid, members in program.groups.items():
            for member in members:
                self.group_of[member.index] = gid
        self._stack: list[Op] = []
        self._queued: set[int] = set()
        self._current: Op | None = None

    # --- the worklist ------------------------------------------------------------------------

    def _push(self, op: Op | None) -> None:
        if op is None or op is self._current or id(op) in self._queued:
            return
        self._queued.add(id(op))
        self._stack.append(op)

    def _notify_users(self, value: Value) -> None:
        for op in reversed(value.uses):
            self._push(op)

    def _notify_changed(self, value: Value) -> None:
        defining = value.defining
        if defining is not None and defining.kind == EDGE:
            for op in reversed(value.target_uses):
                self._push(op)
        self._push(defining)
        self._notify_users(value)

    def run(self) -> None:
        self.func_results()
        self._stack = list(reversed(self.program.ops))
        self._queued = {id(op) for op in self._stack}
        while self._stack:
            op = self._stack.pop()
            self._queued.discard(id(op))
            self._current = op
            self.propagate_op(op)
        self._current = None
        self.func_results()

    # --- one op ------------------------------------------------------------------------------

    def propagate_op(self, op: Op) -> bool:
        rule = rule_of(op, self.conservative, self.program)
        if rule is None:
            return False
        operands, results = op.operands, op.results
        if op.kind == BARRIER:

            def direction(f: int) -> Direction:
                return op.allowed
        else:

            def direction(f: int) -> Direction:
                return self.direction(op, f)

        if op.kind == EDGE and op.before is not None and op.after is not None:
            before, after = op.before, op.after
            return self.propagate_tensors(
                op,
                rule,
                operands,
                results,
                direction,
                lambda v, s: self._set(v, after(s)),
                False,
                result_shardings=[before(results[0].sharding)],
            )
        return self.propagate_tensors(op, rule, operands, results, direction, self._set, is_elementwise(op))

    def propagate_tensors(
        self,
        op: Op | None,
        rule: OpShardingRule,
        operands: list[Value],
        results: list[Value],
        direction: Callable[[int], Direction],
        set_result: Callable[[Value, TensorSharding], None],
        elementwise: bool,
        result_shardings: list[TensorSharding | None] | None = None,
        conservative: bool | None = None,
    ) -> bool:
        meshes = self.program.meshes
        operand_shardings = [v.sharding for v in operands]
        result_now = result_shardings if result_shardings is not None else [v.sharding for v in results]
        found = common_mesh([*operand_shardings, *result_now], meshes)
        if found is None:
            return False
        mesh_name, mesh = found
        if mesh.is_maximal:
            return False
        projection = ShardingProjection.build(operand_shardings, result_now, rule, mesh)

        def local(f: int) -> Direction:
            return Direction.NONE if rule.is_blocked(f) else direction(f)

        cons = self.conservative if conservative is None else conservative
        update = self.strategy(projection, local, rule.factor_sizes, mesh, cons, elementwise)
        changed = False
        for i, value in enumerate(operands):
            if update.operands[i]:
                new = projection.operands[i].to_tensor_sharding(
                    rule.operand_mappings[i], rule.factor_sizes, mesh_name, mesh
                )
                changed |= self._update(value, operand_shardings[i], new, self._set)
        for i, value in enumerate(results):
            if update.results[i]:
                new = projection.results[i].to_tensor_sharding(
                    rule.result_mappings[i], rule.factor_sizes, mesh_name, mesh
                )
                changed |= self._update(value, result_now[i], new, set_result)
        return changed

    def _update(
        self,
        value: Value,
        old: TensorSharding | None,
        new: TensorSharding,
        setter: Callable[[Value, TensorSharding], None],
    ) -> bool:
        if (old is None and _all_empty(new)) or new == old:
            return False
        setter(value, new)
        return True

    def _set(self, value: Value, sharding: TensorSharding) -> None:
        value.sharding = sharding
        value.origin = self._origin(value)
        self._notify_changed(value)
        gid = self.group_of.get(value.index)
        if gid is None:
            return
        for member in self.program.groups[gid]:
            if member is not value:
                member.sharding = sharding
                member.origin = Origin(f"sharding group (shard_alike) with {value.name}", (value.name,))
                self._notify_changed(member)

    def _origin(self, value: Value) -> Origin:
        op = self._current
        step = f", {self.label}" if self.label else ""
        if op is None:
            return Origin(f"the function's result sharding{step}")
        what = op.inst.opcode if op.inst is not None and op.kind != EDGE else "the loop/branch data-flow edge"
        others = [v for v in (*op.operands, *op.results) if v is not value and v.sharding is not None]
        own = value.instruction
        sources = tuple(dict.fromkeys(v.instruction for v in others if v.instruction != own))
        return Origin(f"{self.strategy_name} propagation through {what} {op.name}{step}", sources)

    # --- function results --------------------------------------------------------------------

    def func_results(self) -> None:
        """Exchanges each result's sharding with its returned value through an identity rule."""
        for result in self.program.results:
            value = result.value
            if value.dims is None:
                continue
            rule = pointwise_rule(value.dims, 1, 1)

            def set_result(_v: Value, sharding: TensorSharding, r: object = result) -> None:
                r.sharding = sharding  # type: ignore[attr-defined]

            self.propagate_tensors(
                None,
                rule,
                [value],
                [value],
                lambda _f: Direction.BOTH,
                set_result,
                False,
                result_shardings=[result.sharding],
                conservative=False,
            )


def sync_groups(program: Program) -> None:
    """Gives every member of a sharding group the group's one initial sharding (`syncGroupMemberShardings`).

    Members written with different shardings (`shard_alike` of values constrained apart) keep them: each
    is read through a new fully open constraint, and those constraints form the group instead.
    """
    for gid, members in program.groups.items():
        common: TensorSharding | None = None
        conflict = False
        for member in members:
            s = member.sharding
            if s is None or (_all_empty(s) and all(d.is_open for d in s.dims) and not s.replicated):
                continue
            if common is None:
                common = s
            elif s != common:
                conflict = True
                break
        if common is None:
            continue
        if not conflict:
            for member in members:
                member.sharding = common
            continue
        program.groups[gid] = [_read_through_open_constraint(program, m, common) for m in members]


def _read_through_open_constraint(program: Program, member: Value, like: TensorSharding) -> Value:
    """A new `sharding_constraint` of `member`, fully open, which every reader of `member` reads instead."""
    opened = TensorSharding(like.mesh, tuple(DimSharding((), is_open=True) for _ in like.dims))
    result = Value(len(program.values), member.name + ".group", member.dims, member.array)
    result.instruction = member.instruction
    result.sharding = opened
    program.values.append(result)
    # Shardy writes the constraint at the member's own location (`member.getLoc()`, sharding_group_map.cc).
    op = Op(CONSTRAINT, f"{member.name}.group", program.location_of(member), [member], [result])
    for user in member.uses:
        user.operands = [result if v is member else v for v in user.operands]
    result.uses, member.uses = member.uses, [op]
    result.target_uses, member.target_uses = member.target_uses, []
    for returned in program.results:
        if returned.value is member:
            returned.value = result
            member.extra_uses -= 1
            result.extra_uses += 1
    result.defining = op
    at = program.ops.index(member.defining) + 1 if member.defining in program.ops else 0
    program.ops.insert(at, op)
    return result


STRATEGIES: dict[str, Strategy] = {"basic": propagate_basic, "aggressive": propagate_aggressive}

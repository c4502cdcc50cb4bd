"""Forward rules for ops that move data: broadcast, concatenate, transpose, reshape, reverse, slicing."""

from __future__ import annotations

from collections.abc import Callable

from planner.propagation.gspmd.context import Context
from planner.propagation.gspmd.forward_common import (
    Rule,
    may_reshard,
    partitioned,
    pick_representative_operand,
)
from planner.propagation.shared.graph import Node
from planner.sharding import algebra
from planner.sharding.hlo_sharding import HloSharding
from planner.sharding.merge import is_spatially_partitioned
from planner.sharding.reshape import propagate_through_reshape


def _broadcast(ctx: Context, node: Node) -> bool:
    if ctx.aggressiveness < 3:
        return False
    operand = node.operands[0]
    s = operand.sharding
    if s is None or not is_spatially_partitioned(s) or s.is_replicated or not s.is_tiled:
        return False
    assert s.tile_assignment is not None
    dims = node.inst.attr("dimensions", ())
    tiles = [1] * node.rank
    for i, d in enumerate(dims):
        tiles[d] = s.tile_assignment.dims[i]
    tiles += algebra.subgroup_dims(s)
    out = algebra.reshape_tiles(s, tiles)
    return ctx.improve(node, out, "broadcast", (operand,), may_reshard(ctx, node))


def _concatenate(ctx: Context, node: Node) -> bool:
    operand = pick_representative_operand(node)
    if operand is None or not partitioned(operand):
        return False
    if ctx.aggressiveness == 0:
        concat_dims = node.inst.attr("dimensions", ())
        for o in node.operands:
            s = o.sharding
            if s is None or not s.is_tiled or s.num_tiles <= 1:
                return False
            if not (o.opcode == "reshape" and o.operands[0].opcode in ("parameter", "get-tuple-element")):
                return False
            if any(s.data_tile_dims[d] > 1 for d in concat_dims):
                return False
    assert operand.sharding is not None
    return ctx.improve(node, operand.sharding, "concatenate", (operand,), may_reshard(ctx, node))


def _from_operand(ctx: Context, node: Node, rule: str, through: Callable[[HloSharding], HloSharding]) -> bool:
    """Operand 0's sharding carried through the op (`through`), offered to the node."""
    operand = node.operands[0]
    if not partitioned(operand):
        return False
    assert operand.sharding is not None
    return ctx.improve(node, through(operand.sharding), rule, (operand,), may_reshard(ctx, node))


def _transpose(ctx: Context, node: Node) -> bool:
    dims = node.inst.attr("dimensions", ())
    return _from_operand(ctx, node, "transpose", lambda s: algebra.transpose_sharding(s, dims))


def _reshape(ctx: Context, node: Node) -> bool:
    return _from_operand(ctx, node, "reshape", lambda s: propagate_through_reshape(node.operands[0].dims, node.dims, s))


def _reverse(ctx: Context, node: Node) -> bool:
    dims = node.inst.attr("dimensions", ())
    return _from_operand(ctx, node, "reverse", lambda s: algebra.reverse_sharding(s, dims))


def _sliced_dims(node: Node, operand: Node) -> list[int]:
    return [i for i, (a, b) in enumerate(zip(node.dims, operand.dims)) if a != b]


def _dynamic_slice(ctx: Context, node: Node) -> bool:
    return _from_operand(
        ctx,
        node,
        "dynamic-slice",
        lambda s: algebra.partially_replicate_on_dims(s, _sliced_dims(node, node.operands[0])),
    )


def _dynamic_update_slice(ctx: Context, node: Node) -> bool:
    base, update = node.operands[0], node.operands[1]
    changed = False
    if partitioned(update):
        assert update.sharding is not None
        out = algebra.partially_replicate_on_dims(update.sharding, _sliced_dims(update, base))
        changed |= ctx.improve(node, out, "dynamic-update-slice from update", (update,), may_reshard(ctx, node))
    if partitioned(base):
        assert base.sharding is not None
        changed |= ctx.improve(node, base.sharding, "dynamic-update-slice from base", (base,))
    return changed


RULES: dict[str, Rule] = {
    "broadcast": _broadcast,
    "concatenate": _concatenate,
    "transpose": _transpose,
    "reshape": _reshape,
    "reverse": _reverse,
    "dynamic-slice": _dynamic_slice,
    "dynamic-update-slice": _dynamic_update_slice,
}

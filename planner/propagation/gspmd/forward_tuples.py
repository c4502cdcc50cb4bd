"""Forward rules for tuples and control flow: get-tuple-element, tuple, while, called parameters."""

from __future__ import annotations

from planner.propagation.gspmd.context import Context
from planner.propagation.gspmd.forward_common import (
    Rule,
    may_reshard,
    partitioned,
)
from planner.propagation.shared.graph import Node, sub_sharding
from planner.sharding.hlo_sharding import HloSharding
from planner.sharding.merge import is_more_specific, merge_sharding


def _get_tuple_element(ctx: Context, node: Node) -> bool:
    source = node.operands[0]
    if not partitioned(source):
        return False
    assert source.sharding is not None
    s = sub_sharding(source.sharding, source.shape, node.inst.attr("index"))
    if s.is_manual:
        ctx.set(node, s, "get-tuple-element", (source,))
        return True
    return ctx.improve(node, s, "get-tuple-element", (source,), may_reshard(ctx, node))


def _tuple(ctx: Context, node: Node) -> bool:
    if not any(partitioned(o) for o in node.operands):
        return False
    from planner.propagation.shared.graph import leaf_count

    if node.sharding is not None:
        leaves = list(node.sharding.elements)
    else:
        leaves = [HloSharding.replicate()] * leaf_count(node.shape)
    originally_unsharded = node.sharding is None
    offset = 0
    for operand in node.operands:
        count = leaf_count(operand.shape)
        if operand.sharding is not None:
            op_leaves = list(operand.sharding.elements) if operand.sharding.is_tuple else [operand.sharding]
            if len(op_leaves) == 1 and count > 1:
                op_leaves = op_leaves * count
            for k in range(count):
                if originally_unsharded or is_more_specific(op_leaves[k], leaves[offset + k]):
                    leaves[offset + k] = op_leaves[k]
        offset += count
    new = HloSharding.tuple_of(tuple(leaves))
    if node.sharding is None or new != node.sharding:
        ctx.set(node, new, "tuple", tuple(o for o in node.operands if o.sharding is not None))
        return True
    return False


def _while(ctx: Context, node: Node) -> bool:
    operand = node.operands[0]
    if operand.sharding is None:
        return False
    s = operand.sharding
    if node.sharding is not None:
        merged = merge_sharding(node.sharding, s, ctx.combine_partial)
        s = merged if merged is not None else s
    return ctx.improve(node, s, "while from init", (operand,))


def _parameter(ctx: Context, node: Node) -> bool:
    caller = ctx.computation_map.get(node.computation)
    if caller is None or caller.opcode == "while":
        return False
    number = node.inst.parameter_number or 0
    if caller.opcode == "call":
        operand = caller.operands[number]
    elif caller.opcode == "conditional":
        branch = caller.called.index(node.computation)
        operand = caller.operands[branch + 1]
    else:
        return False
    if operand.sharding is None:
        return False
    return ctx.improve(node, operand.sharding, f"parameter from {caller.opcode} operand", (operand,))


RULES: dict[str, Rule] = {
    "get-tuple-element": _get_tuple_element,
    "tuple": _tuple,
    "while": _while,
    "parameter": _parameter,
}

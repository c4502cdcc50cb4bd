"""Forward inference: a node's sharding from its operands (InferShardingFromOperands).

The dispatcher and the fallbacks every op shares; the per-opcode rules live by concept in
`forward_tuples`, `forward_shapes`, `forward_dot` and `forward_reductions`.
"""

from __future__ import annotations

from planner.propagation.gspmd import forward_dot, forward_reductions, forward_shapes, forward_tuples
from planner.propagation.gspmd.context import Context, is_elementwise, is_passthrough_custom_call
from planner.propagation.gspmd.forward_common import (
    FIRST_OPERAND,
    MOST_SPECIFIC,
    Rule,
    may_reshard,
    partitioned,
    pick_representative_operand,
)
from planner.propagation.shared.graph import Node, tuple_sharding_for
from planner.sharding import algebra
from planner.sharding.hlo_sharding import HloSharding, Kind

_RULES: dict[str, Rule] = {
    **forward_tuples.RULES,
    **forward_shapes.RULES,
    **forward_dot.RULES,
    **forward_reductions.RULES,
}


def infer_from_operands(ctx: Context, node: Node) -> bool:
    if node.unknown_reason is None:
        node.unknown_reason = unmodelled_reason(node)
    if not ctx.can_propagate_at_level(node):
        return False
    if node.sharding is not None and node.sharding.is_manual:
        return False
    if _manual_from_operands(ctx, node):
        return True
    if not ctx.supports_spatial_partitioning(node, ctx.allow_output, False):
        return _replicated_fallback(ctx, node)
    rule = _RULES.get(node.opcode)
    if rule is not None:
        return rule(ctx, node)
    return _default(ctx, node)


def _manual_from_operands(ctx: Context, node: Node) -> bool:
    if node.sharding is not None and not node.sharding.is_tile_maximal:
        return False
    tuple_ok = node.opcode in ("reduce", "sort", "reduce-window") or (
        node.opcode == "custom-call" and not node.is_array
    )
    if not (node.is_array or tuple_ok):
        return False
    for operand in node.operands:
        if operand.sharding is not None and operand.sharding.is_manual:
            if node.is_custom_call("SPMDShardToFullShape"):
                return False
            if ctx.aggressiveness == 0 and node.opcode in ("concatenate", "dynamic-slice"):
                return False
            ctx.set(node, tuple_sharding_for(node.shape, HloSharding.manual()), "manual from operand", (operand,))
            return True
    return False


def _replicated_fallback(ctx: Context, node: Node) -> bool:
    """Ops that cannot be partitioned only ever become replicated."""
    if not node.is_array or not node.operands or node is ctx.graph.root(node.computation):
        return False
    if node.inst.attr("custom_call_has_side_effect", False):
        return False
    for operand in node.operands:
        s = operand.sharding
        if s is not None and s.is_tile_maximal and s.is_replicated:
            return ctx.improve(node, s, "unpartitionable op: replicated", (operand,))
    return False


def _default(ctx: Context, node: Node) -> bool:
    if is_elementwise(node) and ctx.combine_partial:
        changed = False
        single = len(node.operands) == 1 and may_reshard(ctx, node)
        for operand in node.operands:
            if not partitioned(operand):
                continue
            assert operand.sharding is not None
            s = operand.sharding
            if node.opcode == "rng":
                s = algebra.replicate_all_data_dims(s, node.rank)
            elif operand.is_array and node.is_array and operand.rank != node.rank:
                continue
            changed |= ctx.improve(node, s, node.opcode, (operand,), single)
        return changed
    representative = pick_representative_operand(node)
    if representative is None:
        return False
    if not partitioned(representative):
        return False
    assert representative.sharding is not None
    if representative.is_array and node.is_array and representative.rank != node.rank:
        return False
    return ctx.improve(node, representative.sharding, node.opcode, (representative,), may_reshard(ctx, node))


# Ops XLA gives no operand-derived sharding by design, or treats as not
# partitionable (they only ever become replicated): modelled, not unknown.
_NO_FORWARD_RULE = frozenset(
    """constant iota rng-bit-generator conditional parameter after-all bitcast call fusion fft cholesky
    triangular-solve infeed outfeed send send-done recv recv-done partition-id replica-id get-dimension-size
    set-dimension-size dynamic-reshape domain add-dependency rng-get-and-update-state""".split()
)


_KNOWN_CUSTOM_CALLS = frozenset(
    {"Sharding", "ShardBarrierFrom", "ShardBarrierTo", "SPMDFullToShardShape", "SPMDShardToFullShape", "X64Combine",
     "LayoutConstraint"}
)  # fmt: skip


def unmodelled_reason(node: Node) -> str | None:
    """Why this node's forward behaviour may differ from a real XLA's, or None."""
    if node.opcode == "custom-call":
        target = node.inst.attr("custom_call_target")
        if target not in _KNOWN_CUSTOM_CALLS and not is_passthrough_custom_call(node):
            return (
                f"custom-call '{target}' is simulated as not partitionable; an XLA build with a partitioner "
                "registered for it may shard it"
            )
        return None
    if (
        node.opcode in _RULES
        or node.opcode in FIRST_OPERAND
        or node.opcode in MOST_SPECIFIC
        or node.opcode in _NO_FORWARD_RULE
        or is_elementwise(node)
    ):
        return None
    return f"no propagation rule for {node.opcode}"


__all__ = ["Kind", "infer_from_operands", "pick_representative_operand", "unmodelled_reason"]

"""Forward rules for contractions: dot and convolution, the operand they follow, and the user they look ahead to."""

from __future__ import annotations

from planner.propagation.gspmd.context import Context
from planner.propagation.gspmd.forward_common import (
    Rule,
    may_reshard,
    partitioned,
)
from planner.propagation.shared.dot_dims import DotDims, conv_dims, dot_dims, label_positions
from planner.propagation.shared.graph import Node
from planner.sharding import algebra
from planner.sharding.hlo_sharding import HloSharding


def _dot_like(ctx: Context, node: Node, dims: DotDims) -> bool:
    from planner.sharding.merge import improved_sharding

    candidates: list[tuple[HloSharding | None, Node]] = []
    for k, operand in enumerate(node.operands[:2]):
        if not partitioned(operand):
            candidates.append((None, operand))  # type: ignore[arg-type]
            continue
        s = _dot_output_from_operand(operand.sharding, k, dims)  # type: ignore[arg-type]
        improved = improved_sharding(s, node.sharding, node.dims, ctx.combine_partial, False) if s is not None else None
        candidates.append((improved, operand))  # type: ignore[arg-type]
    present: list[tuple[HloSharding, Node]] = [(s, o) for s, o in candidates if s is not None]
    if not present:
        return False
    if len(present) == 1:
        ctx.set(node, present[0][0], "dot from operand", (present[0][1],))
        return True
    (s0, lhs), (s1, rhs) = present
    order = [(s0, lhs), (s1, rhs)]
    decided = False
    lookahead = _lookahead_user_sharding(ctx, node)
    if lookahead is not None:
        a = algebra.is_sub_tiling_or_equal(node.dims, lookahead, s0)
        b = algebra.is_sub_tiling_or_equal(node.dims, lookahead, s1)
        if a and not b:
            decided = True
        elif b and not a:
            order.reverse()
            decided = True
    if not decided and lhs.shape.byte_size < rhs.shape.byte_size:
        order.reverse()
    ctx.set(node, order[0][0], "dot from larger operand" if not decided else "dot from operand (users agree)",
            (order[0][1],))  # fmt: skip
    ctx.improve(node, order[1][0], "dot merged with other operand", (order[0][1], order[1][1]))
    return True


def _dot_output_from_operand(s: HloSharding, k: int, dims: DotDims) -> HloSharding | None:
    if s.is_tile_maximal:
        return s
    side = "lhs" if k == 0 else "rhs"
    other_nc = dims.rhs_non_contracting if k == 0 else dims.lhs_non_contracting
    own_nc = dims.lhs_non_contracting if k == 0 else dims.rhs_non_contracting
    rep = [getattr(d, side) for d in dims.contracting]
    rep += [getattr(d, side) for d in other_nc if getattr(d, side) >= 0]
    r = algebra.partially_replicate_on_dims(s, rep)
    rank = s.tiled_data_rank if s.is_tiled else 0
    out_rank = len(dims.batch) + len(dims.lhs_non_contracting) + len(dims.rhs_non_contracting) + len(dims.conv_spatial)
    op_to_out = [-1] * rank
    out_to_op = [-1] * out_rank
    for d in (*dims.batch, *own_nc):
        src = getattr(d, side)
        if src >= 0 and d.output >= 0:
            op_to_out[src] = d.output
            out_to_op[d.output] = src
    return algebra.transpose_with_collapsed_dims(r, op_to_out, out_to_op)


def _lookahead_user_sharding(ctx: Context, node: Node) -> HloSharding | None:
    from planner.propagation.gspmd.backward import sharding_from_user

    chain = [node]
    current = node
    while True:
        if len(current.users) != 1:
            return None
        user = current.users[0]
        if user.sharding is not None:
            break
        chain.append(user)
        current = user
    saved = [(n, n.sharding) for n in chain[1:]]
    try:
        for i in range(len(chain) - 1, -1, -1):
            below = chain[i]
            above = chain[i + 1] if i + 1 < len(chain) else user
            s = sharding_from_user(ctx, below, above, aggressiveness=1 << 30)
            if s is None:
                return None
            if i == 0:
                return s
            below.sharding = s
    finally:
        for n, s in saved:
            n.sharding = s
    return None


def _dot(ctx: Context, node: Node) -> bool:
    return _dot_like(ctx, node, dot_dims(node.inst, node.operands[0].rank, node.operands[1].rank))


def _convolution(ctx: Context, node: Node) -> bool:
    lhs, rhs = node.operands[0], node.operands[1]
    dims = conv_dims(node.inst, lhs.dims, rhs.dims)
    spatial_sharded = any(
        (lhs.sharding is not None and lhs.sharding.is_tiled and lhs.sharding.data_tile_dims[d.lhs] > 1)
        or (rhs.sharding is not None and rhs.sharding.is_tiled and rhs.sharding.data_tile_dims[d.rhs] > 1)
        for d in dims.conv_spatial
    )
    groups = node.inst.attr("feature_group_count", 1) == 1 and node.inst.attr("batch_group_count", 1) == 1
    if not dims.conv_spatial or (not spatial_sharded and groups):
        return _dot_like(ctx, node, dims)
    if not partitioned(lhs):
        return False
    s = lhs.sharding
    assert s is not None
    if s.is_tile_maximal:
        return ctx.improve(node, s, "convolution from input", (lhs,), may_reshard(ctx, node))
    labels = node.inst.attr("dim_labels")
    lhs_named, lhs_spatial = label_positions(labels.lhs)
    _, rhs_spatial = label_positions(labels.rhs)
    out_named, out_spatial = label_positions(labels.out)
    if _kernel_is_small(rhs.dims, rhs_spatial, node.dims, out_spatial):
        if s.is_tiled and s.data_tile_dims[lhs_named["f"]] > 1:
            return False
        output_to_lhs = [0] * node.rank
        output_to_lhs[out_named["b"]] = lhs_named["b"]
        output_to_lhs[out_named["f"]] = lhs_named["f"]
        for o, i in zip(out_spatial, lhs_spatial):
            output_to_lhs[o] = i
        out = algebra.transpose_sharding(s, output_to_lhs)
        return ctx.improve(node, out, "convolution (small kernel) from input", (lhs,), may_reshard(ctx, node))
    out = algebra.partially_replicate_all_except(s, (lhs_named["b"],))
    return ctx.improve(node, out, "convolution (large kernel) from input batch", (lhs,), may_reshard(ctx, node))


def _kernel_is_small(
    kernel: tuple[int, ...], kernel_spatial: list[int], output: tuple[int, ...], output_spatial: list[int]
) -> bool:
    """IsConvolutionKernelSmall: the window is small against the output in every spatial dim."""
    kernel_product = output_product = 1
    for i, (k, o) in enumerate(zip(kernel_spatial, output_spatial)):
        kernel_dim, output_dim = kernel[k], output[o]
        kernel_product *= kernel_dim
        output_product *= output_dim
        if kernel_dim >= output_dim and (i < 2 or kernel_dim > 3 or kernel_product >= output_product):
            return False
    return True


RULES: dict[str, Rule] = {
    "dot": _dot,
    "convolution": _convolution,
}

"""Backward inference: a node's sharding from its users (InferShardingFromUsers)."""

from __future__ import annotations

from planner.hlo.ir.shapes import ArrayShape, Shape, TupleShape
from planner.propagation.gspmd import gather_scatter as gs
from planner.propagation.gspmd.context import Context
from planner.propagation.shared.dot_dims import DotDims, conv_dims, dot_dims
from planner.propagation.shared.graph import Node, leaf_offsets, sub_sharding
from planner.sharding import algebra
from planner.sharding.hlo_sharding import HloSharding
from planner.sharding.merge import is_more_specific, is_spatially_partitioned, merge_sharding
from planner.sharding.reshape import propagate_through_reshape


def infer_from_users(ctx: Context, node: Node) -> bool:
    if node.opcode == "broadcast" and not ctx.at_least(2):
        return False
    if node.sharding is not None and node.sharding.is_manual:
        return False
    if node.sharding is None or node.sharding.is_tile_maximal:
        for user in node.users:
            if user.sharding is None or user.is_custom_call("SPMDFullToShardShape"):
                continue
            if node.is_array and user.sharding.is_manual:
                ctx.set(node, HloSharding.manual(), "manual from user", (user,))
                return True
            s = sharding_from_user(ctx, node, user)
            if s is not None and s.is_manual:
                ctx.set(node, s, "manual from user", (user,))
                return True
    if not ctx.supports_spatial_partitioning(node, False, ctx.allow_parameters):
        return False
    improved = False
    for user in node.users:
        if user.opcode == "rng-bit-generator":
            # XLA forces the seed of a random-bit generator to be replicated.
            ctx.set(node, HloSharding.replicate(), "operand of rng-bit-generator", (user,))
            return True
        s = sharding_from_user(ctx, node, user)
        if s is not None and node.is_custom_call("ShardBarrierTo"):
            s = HloSharding.replicate()  # nothing flows backward through this barrier
        if s is not None:
            improved |= ctx.improve(node, s, f"from user {user.opcode}", (user,))
    return improved


def _compatible(a: Shape, b: Shape) -> bool:
    """ShapeUtil::CompatibleIgnoringElementType."""
    if isinstance(a, ArrayShape) and isinstance(b, ArrayShape):
        return a.dims == b.dims
    if isinstance(a, TupleShape) and isinstance(b, TupleShape):
        return len(a.elements) == len(b.elements) and all(_compatible(x, y) for x, y in zip(a.elements, b.elements))
    return False


def sharding_from_user(ctx: Context, node: Node, user: Node, aggressiveness: int | None = None) -> HloSharding | None:
    """GetShardingFromUser: the sharding `user` wants for its operand `node`, at the current level or the one given."""
    if aggressiveness is None:
        return _sharding_from_user(ctx, node, user)
    saved = ctx.swap_level(aggressiveness)
    try:
        return _sharding_from_user(ctx, node, user)
    finally:
        ctx.swap_level(saved)


def _sharding_from_user(ctx: Context, node: Node, user: Node) -> HloSharding | None:
    if not ctx.can_propagate_at_level(user):
        return None
    us = user.sharding
    if us is None or not is_spatially_partitioned(us):
        return None
    rule = _RULES.get(user.opcode)
    if rule is not None:
        return rule(ctx, node, user, us)
    return us if _compatible(node.shape, user.shape) else None


def _broadcast(ctx: Context, node: Node, user: Node, us: HloSharding) -> HloSharding | None:
    if us.is_replicated or us.is_manual:
        return us
    dims = user.inst.attr("dimensions", ())
    replicate = [d for d in range(user.rank) if d not in dims]
    if not ctx.options.is_spmd and us.is_tiled and any(us.data_tile_dims[d] > 1 for d in replicate):
        return None
    return algebra.remove_dims(algebra.partially_replicate_on_dims(us, replicate), replicate)


def _concatenate(ctx: Context, node: Node, user: Node, us: HloSharding) -> HloSharding | None:
    if not ctx.at_least(1):
        return None
    if us.is_replicated or ctx.options.is_spmd or not us.is_tiled:
        return us
    cdim = user.inst.attr("dimensions", (0,))[0]
    tiles = us.data_tile_dims[cdim]
    if tiles == 1:
        return us
    # Non-SPMD: this operand lives on the devices whose tiles cover its range.
    assert us.tile_assignment is not None
    offset = 0
    for operand in user.operands:
        if operand is node:
            break
        offset += operand.dims[cdim]
    tile = -(-user.dims[cdim] // tiles)
    first, end = offset // tile, -(-(offset + node.dims[cdim]) // tile)
    array = us.tile_assignment.array().take(range(first, end), axis=cdim)
    if array.size == 1:
        return HloSharding.maximal(int(array.reshape(-1)[0]))
    from planner.sharding.tile_assignment import TileAssignment

    return HloSharding.tile(TileAssignment.from_devices(array))


def _dynamic_slicing(ctx: Context, node: Node, user: Node, us: HloSharding) -> HloSharding | None:
    if not ctx.at_least(1):
        return None
    if us.is_replicated:
        return us
    index = user.operand_index(node)
    if user.opcode == "dynamic-update-slice" and index == 0:
        return us
    sliced = 1 if user.opcode == "dynamic-update-slice" else 0
    if index != sliced:
        return None
    dims = [i for i, (a, b) in enumerate(zip(user.dims, node.dims)) if a != b]
    return algebra.partially_replicate_on_dims(us, dims)


def _reshape(ctx: Context, node: Node, user: Node, us: HloSharding) -> HloSharding | None:
    return propagate_through_reshape(user.dims, node.dims, us)


def _pad(ctx: Context, node: Node, user: Node, us: HloSharding) -> HloSharding | None:
    return us if user.operand_index(node) == 0 else None


def _slice(ctx: Context, node: Node, user: Node, us: HloSharding) -> HloSharding | None:
    return us


def _transpose(ctx: Context, node: Node, user: Node, us: HloSharding) -> HloSharding | None:
    dims = user.inst.attr("dimensions", ())
    inverse = [0] * len(dims)
    for i, d in enumerate(dims):
        inverse[d] = i
    return algebra.transpose_sharding(us, inverse)


def _reverse(ctx: Context, node: Node, user: Node, us: HloSharding) -> HloSharding | None:
    return algebra.reverse_sharding(us, user.inst.attr("dimensions", ()))


def _tuple(ctx: Context, node: Node, user: Node, us: HloSharding) -> HloSharding | None:
    best: HloSharding | None = None
    for i, operand in enumerate(user.operands):
        if operand is not node:
            continue
        s = sub_sharding(us, user.shape, i)
        if best is None or is_more_specific(s, best):
            best = s
    return best


def _get_tuple_element(ctx: Context, node: Node, user: Node, us: HloSharding) -> HloSharding | None:
    assert isinstance(node.shape, TupleShape)
    index = user.inst.attr("index")
    offsets = leaf_offsets(node.shape)
    offset, count = offsets[index], offsets[index + 1] - offsets[index]
    new = us.elements if us.is_tuple else (us,)
    if node.sharding is not None and node.sharding.is_tuple:
        current = node.sharding.elements[offset : offset + count]
        if current == new and node.sharding.shard_group is None:
            # The user wants what the tuple already holds there: the candidate would equal the existing
            # sharding, so hand back that (no 100-element rebuild to compare equal).
            return node.sharding
        leaves = list(node.sharding.elements)
    else:
        first = us.elements[0] if us.is_tuple and us.elements else us
        if us.is_tuple and not us.elements:
            return None
        leaves = [algebra.replicate_all_data_dims(first, len(leaf.dims)) for leaf in node.shape.leaves()]
    leaves[offset : offset + count] = new
    return HloSharding.tuple_of(tuple(leaves))


def _dot(ctx: Context, node: Node, user: Node, us: HloSharding) -> HloSharding | None:
    lhs, rhs = user.operands[0], user.operands[1]
    dims = dot_dims(user.inst, lhs.rank, rhs.rank)
    return dot_operand_sharding(ctx, user, us, user.operand_index(node), dims)


def _convolution(ctx: Context, node: Node, user: Node, us: HloSharding) -> HloSharding | None:
    dims = conv_dims(user.inst, user.operands[0].dims, user.operands[1].dims)
    if dims.conv_spatial:
        return None
    return dot_operand_sharding(ctx, user, us, user.operand_index(node), dims)


def operand_sharding_from_output(
    output: HloSharding, k: int, dims: DotDims, output_rank: int, operand_rank: int
) -> HloSharding:
    """What operand k must look like for the dot to produce `output` without moving it.

    The other side's free dims (and contracting dims) of the output become
    replicas; batch and own free dims map back to operand k's dims.
    """
    side = "lhs" if k == 0 else "rhs"
    other_nc = dims.rhs_non_contracting if k == 0 else dims.lhs_non_contracting
    own_nc = dims.lhs_non_contracting if k == 0 else dims.rhs_non_contracting
    out_rep = [d.output for d in other_nc] + [d.output for d in dims.contracting if d.output >= 0]
    s = algebra.partially_replicate_on_dims(output, out_rep)
    out_to_op = [-1] * output_rank
    op_to_out = [-1] * operand_rank
    for d in (*dims.batch, *own_nc):
        if d.output >= 0 and getattr(d, side) >= 0:
            out_to_op[d.output] = getattr(d, side)
            op_to_out[getattr(d, side)] = d.output
    mapped = algebra.transpose_with_collapsed_dims(s, out_to_op, op_to_out)
    return mapped if mapped is not None else HloSharding.replicate()


def dot_operand_sharding(ctx: Context, dot: Node, us: HloSharding | None, k: int, dims: DotDims) -> HloSharding:
    """InferDotOperandSharding: operand k's sharding from the output and the other operand."""
    side, other_side = ("lhs", "rhs") if k == 0 else ("rhs", "lhs")
    other_nc = dims.rhs_non_contracting if k == 0 else dims.lhs_non_contracting
    own_nc = dims.lhs_non_contracting if k == 0 else dims.rhs_non_contracting
    operand_rank = dot.operands[k].rank
    sharding = HloSharding.replicate()
    if us is not None:
        sharding = operand_sharding_from_output(us, k, dims, dot.rank, operand_rank)
    other = dot.operands[1 - k]
    if other.sharding is not None and is_spatially_partitioned(other.sharding):
        other_rep = [getattr(d, other_side) for d in other_nc]
        other_rep += [getattr(d, other_side) for d in own_nc if getattr(d, other_side) >= 0]
        o = algebra.partially_replicate_on_dims(other.sharding, other_rep)
        other_to_op = [-1] * other.rank
        op_to_other = [-1] * operand_rank
        for d in (*dims.batch, *dims.contracting):
            a, b = getattr(d, other_side), getattr(d, side)
            if a >= 0 and b >= 0:
                other_to_op[a] = b
                op_to_other[b] = a
        from_other = algebra.transpose_with_collapsed_dims(o, other_to_op, op_to_other)
        if from_other is not None:
            merged = merge_sharding(sharding, from_other, ctx.combine_partial)
            if merged is not None:
                sharding = merged
    return sharding


def _reduce(ctx: Context, node: Node, user: Node, us: HloSharding) -> HloSharding | None:
    if node.is_array and node.rank == 0:
        return None
    index = user.operand_index(node)
    s = sub_sharding(us, user.shape, index) if us.is_tuple else us
    if s.is_tiled:
        assert s.tile_assignment is not None
        reduced = set(user.inst.attr("dimensions", ()))
        tiles: list[int] = []
        source = list(s.tile_assignment.dims)
        for i in range(node.rank):
            tiles.append(1 if i in reduced else source.pop(0))
        tiles += source
        s = algebra.reshape_tiles(s, tiles)
    count = len(user.operands) // 2
    for other in user.operands[:count]:
        if other is node or other.sharding is None or other.sharding.is_tuple:
            continue
        if other.sharding.is_manual or s.is_manual:
            continue
        merged = algebra.merge_if_compatible(other.sharding, s)
        if merged is not None:
            s = merged
    return s


def _sort(ctx: Context, node: Node, user: Node, us: HloSharding) -> HloSharding | None:
    return sub_sharding(us, user.shape, user.operand_index(node)) if us.is_tuple else us


def _reduce_window(ctx: Context, node: Node, user: Node, us: HloSharding) -> HloSharding | None:
    # Only the data inputs (the first half of the operands) take the output's sharding;
    # the scalar init values after them do not (GetShardingFromUser's kReduceWindow case).
    index = user.operand_index(node)
    if index >= len(user.operands) // 2:
        return None
    return sub_sharding(us, user.shape, index) if us.is_tuple else us


def _custom_call(ctx: Context, node: Node, user: Node, us: HloSharding) -> HloSharding | None:
    return us if _compatible(node.shape, user.shape) else None


def _outfeed(ctx: Context, node: Node, user: Node, us: HloSharding) -> HloSharding | None:
    if user.operand_index(node) != 0:
        return None
    # The outfeed's sharding covers (its operands..., token): take operand 0's part.
    shape = TupleShape(tuple(o.shape for o in user.operands))
    return sub_sharding(us, shape, 0) if us.is_tuple else us


def _gather(ctx: Context, node: Node, user: Node, us: HloSharding) -> HloSharding | None:
    spec = gs.gather_spec(user)
    index = user.operand_index(node)
    if index == 1:
        return gs.index_from_output(spec, us)
    if index == 0 and ctx.options.is_spmd:
        return gs.operand_from_output(spec, us)
    return None


def _scatter(ctx: Context, node: Node, user: Node, us: HloSharding) -> HloSharding | None:
    count = (len(user.operands) - 1) // 2
    index = user.operand_index(node)
    if index < count:
        return sub_sharding(us, user.shape, index) if us.is_tuple else us
    spec = gs.scatter_spec(user)
    indices = user.operands[count]
    updates = user.operands[count + 1 :]
    if index == count:
        from_updates = [
            gs.index_from_output(spec, u.sharding)
            for u in updates
            if u.sharding is not None and is_spatially_partitioned(u.sharding)
        ]
        return algebra.find_common_sharding(from_updates) if from_updates else None
    update_index = index - count - 1
    from_indices = HloSharding.replicate()
    if indices.sharding is not None and is_spatially_partitioned(indices.sharding):
        from_indices = gs.output_from_index(spec, indices.sharding)
    if ctx.options.is_spmd:
        output = sub_sharding(us, user.shape, update_index) if us.is_tuple else us
        from_output = gs.operand_to_update(spec, output)
        if from_output is not None:
            if not from_indices.is_manual and not from_output.is_manual:
                merged = algebra.merge_if_compatible(from_indices, from_output)
                from_output = merged if merged is not None else from_output
            if not from_output.is_tile_maximal:
                return from_output
    return from_indices if not from_indices.is_tile_maximal else None


_RULES = {
    "broadcast": _broadcast,
    "concatenate": _concatenate,
    "dynamic-slice": _dynamic_slicing,
    "dynamic-update-slice": _dynamic_slicing,
    "reshape": _reshape,
    "pad": _pad,
    "slice": _slice,
    "transpose": _transpose,
    "reverse": _reverse,
    "tuple": _tuple,
    "get-tuple-element": _get_tuple_element,
    "dot": _dot,
    "convolution": _convolution,
    "reduce": _reduce,
    "sort": _sort,
    "reduce-window": _reduce_window,
    "custom-call": _custom_call,
    "outfeed": _outfeed,
    "gather": _gather,
    "scatter": _scatter,
}

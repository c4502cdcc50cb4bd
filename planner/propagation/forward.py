"""Forward inference: a node's sharding from its operands (InferShardingFromOperands)."""

from __future__ import annotations

from planner.propagation import gather_scatter as gs
from planner.propagation.context import Context, is_elementwise
from planner.propagation.dot_dims import DotDims, conv_dims, dot_dims, label_positions
from planner.propagation.graph import Node, sub_sharding, tuple_sharding_for
from planner.sharding import algebra
from planner.sharding.hlo_sharding import HloSharding, Kind
from planner.sharding.merge import is_more_specific, is_spatially_partitioned, merge_sharding
from planner.sharding.reshape import propagate_through_reshape

# PickRepresentativeOperand: ops that take operand 0, and ops that take the most specific operand.
_FIRST_OPERAND = frozenset(
    "map pad power opt-barrier reverse slice shift-left shift-right-arithmetic shift-right-logical".split()
)
_MOST_SPECIFIC = frozenset(
    """abs add and atan2 bitcast-convert ceil clamp count-leading-zeros compare complex concatenate convert copy cosine
    all-gather all-reduce reduce-scatter all-to-all collective-broadcast collective-permute divide erf exponential
    exponential-minus-one floor imag is-finite log log-plus-one logistic maximum minimum multiply negate not or
    popcnt real reduce-precision remainder round-nearest-afz round-nearest-even rsqrt select sign sine sort sqrt
    cbrt subtract stochastic-convert tan tanh topk while xor""".split()
)


def pick_representative_operand(node: Node) -> Node | None:
    if node.opcode in _FIRST_OPERAND:
        return node.operands[0] if node.operands and node.operands[0].sharding is not None else None
    if node.opcode == "custom-call":
        if node.inst.attr("custom_call_target") in ("Sharding", "X64Combine", "LayoutConstraint"):
            return node.operands[0] if node.operands[0].sharding is not None else None
        return None
    if node.opcode not in _MOST_SPECIFIC:
        return None
    best: Node | None = None
    for operand in node.operands:
        if operand.sharding is None:
            continue
        if best is None or (
            operand.sharding.is_tuple == best.sharding.is_tuple  # type: ignore[union-attr]
            and is_more_specific(operand.sharding, best.sharding)  # type: ignore[arg-type]
        ):
            best = operand
    return best


def _partitioned(node: Node) -> bool:
    return node.sharding is not None and is_spatially_partitioned(node.sharding)


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


def _aggressive(ctx: Context, node: Node) -> bool:
    return ctx.non_root_users(node) == 1


def _get_tuple_element(ctx: Context, node: Node) -> bool:
    source = node.operands[0]
    if not _partitioned(source):
        return False
    assert source.sharding is not None
    s = sub_sharding(source.sharding, source.shape, node.inst.attr("index"))
    if s.is_manual:
        ctx.set(node, s, "get-tuple-element", (source,))
        return True
    return ctx.improve(node, s, "get-tuple-element", (source,), _aggressive(ctx, node))


def _tuple(ctx: Context, node: Node) -> bool:
    if not any(_partitioned(o) for o in node.operands):
        return False
    from planner.propagation.graph import leaf_count

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


def _reduce(ctx: Context, node: Node) -> bool:
    changed = False
    count = len(node.operands) // 2
    reduced = node.inst.attr("dimensions", ())
    for operand in node.operands[:count]:
        if not _partitioned(operand):
            continue
        s = operand.sharding
        assert s is not None
        if s.is_manual:
            changed |= ctx.improve(
                node, tuple_sharding_for(node.shape, s), "reduce", (operand,), _aggressive(ctx, node)
            )
            continue
        if s.is_replicated or (
            not ctx.options.is_spmd and s.is_tiled and any(s.data_tile_dims[d] > 1 for d in reduced)
        ):
            out = algebra.replicate_all_data_dims(s)
        else:
            p = algebra.partially_replicate_on_dims(s, reduced)
            out = p if p.is_replicated else algebra.remove_dims(p, reduced)
        changed |= ctx.improve(node, tuple_sharding_for(node.shape, out), "reduce", (operand,), _aggressive(ctx, node))
    return changed


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
    out = algebra._rebuild(s, s.tile_assignment.reshape(tuple(tiles)))
    return ctx.improve(node, out, "broadcast", (operand,), _aggressive(ctx, node))


def _concatenate(ctx: Context, node: Node) -> bool:
    operand = pick_representative_operand(node)
    if operand is None or not _partitioned(operand):
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
    return ctx.improve(node, operand.sharding, "concatenate", (operand,), _aggressive(ctx, node))


def _transpose(ctx: Context, node: Node) -> bool:
    operand = node.operands[0]
    if not _partitioned(operand):
        return False
    assert operand.sharding is not None
    out = algebra.transpose_sharding(operand.sharding, node.inst.attr("dimensions", ()))
    return ctx.improve(node, out, "transpose", (operand,), _aggressive(ctx, node))


def _reshape(ctx: Context, node: Node) -> bool:
    operand = node.operands[0]
    if not _partitioned(operand):
        return False
    assert operand.sharding is not None
    out = propagate_through_reshape(operand.dims, node.dims, operand.sharding)
    return ctx.improve(node, out, "reshape", (operand,), _aggressive(ctx, node))


def _reverse(ctx: Context, node: Node) -> bool:
    operand = node.operands[0]
    if not _partitioned(operand):
        return False
    assert operand.sharding is not None
    out = algebra.reverse_sharding(operand.sharding, node.inst.attr("dimensions", ()))
    return ctx.improve(node, out, "reverse", (operand,), _aggressive(ctx, node))


def _sliced_dims(node: Node, operand: Node) -> list[int]:
    return [i for i, (a, b) in enumerate(zip(node.dims, operand.dims)) if a != b]


def _dynamic_slice(ctx: Context, node: Node) -> bool:
    operand = node.operands[0]
    if not _partitioned(operand):
        return False
    assert operand.sharding is not None
    out = algebra.partially_replicate_on_dims(operand.sharding, _sliced_dims(node, operand))
    return ctx.improve(node, out, "dynamic-slice", (operand,), _aggressive(ctx, node))


def _dynamic_update_slice(ctx: Context, node: Node) -> bool:
    base, update = node.operands[0], node.operands[1]
    changed = False
    if _partitioned(update):
        assert update.sharding is not None
        out = algebra.partially_replicate_on_dims(update.sharding, _sliced_dims(update, base))
        changed |= ctx.improve(node, out, "dynamic-update-slice from update", (update,), _aggressive(ctx, node))
    if _partitioned(base):
        assert base.sharding is not None
        changed |= ctx.improve(node, base.sharding, "dynamic-update-slice from base", (base,))
    return changed


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


def _dot_like(ctx: Context, node: Node, dims: DotDims) -> bool:
    from planner.sharding.merge import improved_sharding

    candidates: list[tuple[HloSharding | None, Node]] = []
    for k, operand in enumerate(node.operands[:2]):
        if not _partitioned(operand):
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
    from planner.propagation.backward import sharding_from_user

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
    if not _partitioned(lhs):
        return False
    s = lhs.sharding
    assert s is not None
    if s.is_tile_maximal:
        return ctx.improve(node, s, "convolution from input", (lhs,), _aggressive(ctx, node))
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
        return ctx.improve(node, out, "convolution (small kernel) from input", (lhs,), _aggressive(ctx, node))
    out = algebra.partially_replicate_all_except(s, (lhs_named["b"],))
    return ctx.improve(node, out, "convolution (large kernel) from input batch", (lhs,), _aggressive(ctx, node))


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


def _sort(ctx: Context, node: Node) -> bool:
    operand = pick_representative_operand(node)
    if operand is None or not _partitioned(operand):
        return False
    s = operand.sharding
    assert s is not None
    sort_dim = node.inst.attr("dimensions", (0,))[0]
    if s.is_tiled and s.data_tile_dims[sort_dim] > 1:
        # Sharded along the sort dim: only if the tiles could move to another dim.
        dims = operand.dims
        tiles = s.data_tile_dims
        movable = (
            len(dims) >= 2
            and dims[sort_dim] != 1
            and any(d != sort_dim and dims[d] % (tiles[sort_dim] * tiles[d]) == 0 for d in range(len(dims)))
        )
        if not movable:
            return False
    return ctx.improve(node, tuple_sharding_for(node.shape, s), "sort", (operand,), _aggressive(ctx, node))


def _custom_call(ctx: Context, node: Node) -> bool:
    if node.is_custom_call("ShardBarrierFrom"):
        return False  # a barrier: nothing flows forward through it
    operand = node.operands[0] if node.is_custom_call("ShardBarrierTo") else pick_representative_operand(node)
    if operand is None or not _partitioned(operand):
        return False
    assert operand.sharding is not None
    return ctx.improve(node, operand.sharding, node.inst.attr("custom_call_target"), (operand,), _aggressive(ctx, node))


def improve_element(
    ctx: Context, node: Node, s: HloSharding, index: int, rule: str, sources: tuple[Node, ...], aggressive: bool = False
) -> bool:
    """MaybeImproveInstructionSubSharding: improve one output of a multi-output op."""
    if node.is_array:
        return ctx.improve(node, s, rule, sources, aggressive)
    from planner.hlo.shapes import TupleShape
    from planner.sharding.merge import improved_sharding

    assert isinstance(node.shape, TupleShape)
    leaf = node.shape.elements[index]
    current = node.sharding
    existing = current.elements[index] if current is not None and current.is_tuple else current
    dims = leaf.dims if hasattr(leaf, "dims") else None
    result = improved_sharding(s, existing, dims, ctx.combine_partial, aggressive)
    if result is None:
        return False
    count = len(node.shape.elements)
    leaves = list(current.elements) if current is not None and current.is_tuple else [HloSharding.replicate()] * count
    leaves[index] = result
    ctx.set(node, HloSharding.tuple_of(tuple(leaves)), rule, sources)
    return True


def _gather(ctx: Context, node: Node) -> bool:
    spec = gs.gather_spec(node)
    aggressive = _aggressive(ctx, node)
    operand, indices = spec.operand, spec.indices
    changed = False
    parallel = [gs.explicit_parallel(spec)]
    if ctx.options.is_spmd:
        parallel.append(gs.implicit_parallel(spec))
    if parallel[0] is not None:
        changed |= _gather_parallel(ctx, node, spec, parallel[0], aggressive)
    if _partitioned(indices):
        assert indices.sharding is not None
        out = gs.output_from_index(spec, indices.sharding)
        changed |= ctx.improve(node, out, "gather from indices", (indices,), aggressive)
    if ctx.options.is_spmd:
        if len(parallel) > 1 and parallel[1] is not None:
            changed |= _gather_parallel(ctx, node, spec, parallel[1], aggressive)
        if _partitioned(operand):
            assert operand.sharding is not None
            parallel_dims = [d for p in parallel if p is not None for d in p.operand_dims]
            source = algebra.partially_replicate_on_dims(operand.sharding, parallel_dims)
            passthrough = gs.output_from_operand_passthrough(spec, source)
            if passthrough is not None:
                changed |= ctx.improve(node, passthrough, "gather from operand (whole slices)", (operand,), aggressive)
    return changed


def _gather_parallel(ctx: Context, node: Node, spec: gs.Spec, dims: gs.Dims, aggressive: bool) -> bool:
    changed = False
    for source, source_dims in ((spec.operand, dims.operand_dims), (spec.indices, dims.indices_dims)):
        if _partitioned(source):
            assert source.sharding is not None
            out = gs.parallel_from(source.sharding, source_dims, dims.output_dims, node.rank)
            changed |= ctx.improve(node, out, "gather parallel dims", (source,), aggressive)
    return changed


def _scatter(ctx: Context, node: Node) -> bool:
    count = (len(node.operands) - 1) // 2
    if not ctx.options.is_spmd:
        return any(
            [improve_element(ctx, node, HloSharding.replicate(), i, "scatter (non-SPMD)", ()) for i in range(count)]
        )
    spec = gs.scatter_spec(node)
    aggressive = _aggressive(ctx, node)
    operands, indices, updates = node.operands[:count], node.operands[count], node.operands[count + 1 :]
    rank = spec.operand.rank
    changed = False
    explicit = gs.explicit_parallel(spec)
    if explicit is not None:
        changed |= _scatter_parallel(ctx, node, spec, explicit, count, aggressive)
    for i, operand in enumerate(operands):
        if _partitioned(operand):
            assert operand.sharding is not None
            changed |= improve_element(ctx, node, operand.sharding, i, "scatter from operand", (operand,), aggressive)
    if not _partitioned(indices) and not any(_partitioned(u) for u in updates):
        return changed
    implicit = gs.implicit_parallel(spec)
    if implicit is not None:
        changed |= _scatter_parallel(ctx, node, spec, implicit, count, aggressive)
    for i, update in enumerate(updates):
        if not _partitioned(update):
            continue
        assert update.sharding is not None
        s = update.sharding
        if s.is_tiled:
            dims = gs.operand_passthrough(spec)
            s = algebra.propagate_along_dims(s, dims.output_dims, dims.operand_dims, rank)
            if s.is_tile_maximal:
                continue
        changed |= improve_element(ctx, node, s, i, "scatter from update (whole slices)", (update,), aggressive)
    return changed


def _scatter_parallel(ctx: Context, node: Node, spec: gs.Spec, dims: gs.Dims, count: int, aggressive: bool) -> bool:
    changed = False
    rank = spec.operand.rank
    sources = [(o, dims.operand_dims) for o in node.operands[:count]]
    sources.append((node.operands[count], dims.indices_dims))
    sources += [(u, dims.output_dims) for u in node.operands[count + 1 :]]
    for source, source_dims in sources:
        if not _partitioned(source):
            continue
        assert source.sharding is not None
        out = gs.parallel_from(source.sharding, source_dims, dims.operand_dims, rank)
        for i in range(count):
            changed |= improve_element(ctx, node, out, i, "scatter parallel dims", (source,), aggressive)
    return changed


def _reduce_window(ctx: Context, node: Node) -> bool:
    window = node.inst.attr("window", ())
    if any(w.lhs_dilate > 1 or w.rhs_dilate > 1 for w in window):
        return False
    changed = False
    for operand in node.operands[: len(node.operands) // 2]:
        if _partitioned(operand):
            assert operand.sharding is not None
            s = tuple_sharding_for(node.shape, operand.sharding)
            changed |= ctx.improve(node, s, "reduce-window", (operand,), _aggressive(ctx, node))
    return changed


def _select_and_scatter(ctx: Context, node: Node) -> bool:
    operand = node.operands[0]
    window = node.inst.attr("window", ())
    if not _partitioned(operand) or any(w.lhs_dilate > 1 for w in window):
        return False
    assert operand.sharding is not None
    return ctx.improve(node, operand.sharding, "select-and-scatter", (operand,), _aggressive(ctx, node))


def _default(ctx: Context, node: Node) -> bool:
    if is_elementwise(node) and ctx.combine_partial:
        changed = False
        single = len(node.operands) == 1 and _aggressive(ctx, node)
        for operand in node.operands:
            if not _partitioned(operand):
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
    if not _partitioned(representative):
        return False
    assert representative.sharding is not None
    if representative.is_array and node.is_array and representative.rank != node.rank:
        return False
    return ctx.improve(node, representative.sharding, node.opcode, (representative,), _aggressive(ctx, node))


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
        if target not in _KNOWN_CUSTOM_CALLS:
            return (
                f"custom-call '{target}' is simulated as not partitionable; an XLA build with a partitioner "
                "registered for it may shard it"
            )
        return None
    if (
        node.opcode in _RULES
        or node.opcode in _FIRST_OPERAND
        or node.opcode in _MOST_SPECIFIC
        or node.opcode in _NO_FORWARD_RULE
        or is_elementwise(node)
    ):
        return None
    return f"no propagation rule for {node.opcode}"


_RULES = {
    "get-tuple-element": _get_tuple_element,
    "tuple": _tuple,
    "reduce": _reduce,
    "broadcast": _broadcast,
    "concatenate": _concatenate,
    "transpose": _transpose,
    "reshape": _reshape,
    "reverse": _reverse,
    "dot": _dot,
    "convolution": _convolution,
    "dynamic-slice": _dynamic_slice,
    "dynamic-update-slice": _dynamic_update_slice,
    "while": _while,
    "parameter": _parameter,
    "sort": _sort,
    "custom-call": _custom_call,
    "gather": _gather,
    "scatter": _scatter,
    "reduce-window": _reduce_window,
    "select-and-scatter": _select_and_scatter,
}

__all__ = ["Kind", "infer_from_operands", "pick_representative_operand"]

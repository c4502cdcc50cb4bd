"""Forward rules for reductions, sorting, gather/scatter, windows and custom-calls."""

from __future__ import annotations

from planner.propagation.gspmd import gather_scatter as gs
from planner.propagation.gspmd.context import Context
from planner.propagation.gspmd.forward_common import (
    Rule,
    improve_element,
    may_reshard,
    partitioned,
    pick_representative_operand,
)
from planner.propagation.shared.graph import Node, tuple_sharding_for
from planner.sharding import algebra
from planner.sharding.hlo_sharding import HloSharding


def _reduce(ctx: Context, node: Node) -> bool:
    changed = False
    count = len(node.operands) // 2
    reduced = node.inst.attr("dimensions", ())
    for operand in node.operands[:count]:
        if not partitioned(operand):
            continue
        s = operand.sharding
        assert s is not None
        if s.is_manual:
            changed |= ctx.improve(
                node, tuple_sharding_for(node.shape, s), "reduce", (operand,), may_reshard(ctx, node)
            )
            continue
        if s.is_replicated or (
            not ctx.options.is_spmd and s.is_tiled and any(s.data_tile_dims[d] > 1 for d in reduced)
        ):
            out = algebra.replicate_all_data_dims(s)
        else:
            p = algebra.partially_replicate_on_dims(s, reduced)
            out = p if p.is_replicated else algebra.remove_dims(p, reduced)
        changed |= ctx.improve(node, tuple_sharding_for(node.shape, out), "reduce", (operand,), may_reshard(ctx, node))
    return changed


def _sort(ctx: Context, node: Node) -> bool:
    operand = pick_representative_operand(node)
    if operand is None or not partitioned(operand):
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
    return ctx.improve(node, tuple_sharding_for(node.shape, s), "sort", (operand,), may_reshard(ctx, node))


def _custom_call(ctx: Context, node: Node) -> bool:
    if node.is_custom_call("ShardBarrierFrom"):
        return False  # a barrier: nothing flows forward through it
    operand = node.operands[0] if node.is_custom_call("ShardBarrierTo") else pick_representative_operand(node)
    if operand is None or not partitioned(operand):
        return False
    assert operand.sharding is not None
    return ctx.improve(node, operand.sharding, node.inst.attr("custom_call_target"), (operand,), may_reshard(ctx, node))


def _gather(ctx: Context, node: Node) -> bool:
    spec = gs.gather_spec(node)
    aggressive = may_reshard(ctx, node)
    operand, indices = spec.operand, spec.indices
    changed = False
    parallel = [gs.explicit_parallel(spec)]
    if ctx.options.is_spmd:
        parallel.append(gs.implicit_parallel(spec))
    if parallel[0] is not None:
        changed |= _gather_parallel(ctx, node, spec, parallel[0], aggressive)
    if partitioned(indices):
        assert indices.sharding is not None
        out = gs.output_from_index(spec, indices.sharding)
        changed |= ctx.improve(node, out, "gather from indices", (indices,), aggressive)
    if ctx.options.is_spmd:
        if len(parallel) > 1 and parallel[1] is not None:
            changed |= _gather_parallel(ctx, node, spec, parallel[1], aggressive)
        if partitioned(operand):
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
        if partitioned(source):
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
    aggressive = may_reshard(ctx, node)
    operands, indices, updates = node.operands[:count], node.operands[count], node.operands[count + 1 :]
    rank = spec.operand.rank
    changed = False
    explicit = gs.explicit_parallel(spec)
    if explicit is not None:
        changed |= _scatter_parallel(ctx, node, spec, explicit, count, aggressive)
    for i, operand in enumerate(operands):
        if partitioned(operand):
            assert operand.sharding is not None
            changed |= improve_element(ctx, node, operand.sharding, i, "scatter from operand", (operand,), aggressive)
    if not partitioned(indices) and not any(partitioned(u) for u in updates):
        return changed
    implicit = gs.implicit_parallel(spec)
    if implicit is not None:
        changed |= _scatter_parallel(ctx, node, spec, implicit, count, aggressive)
    for i, update in enumerate(updates):
        if not partitioned(update):
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
        if not partitioned(source):
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
        if partitioned(operand):
            assert operand.sharding is not None
            s = tuple_sharding_for(node.shape, operand.sharding)
            changed |= ctx.improve(node, s, "reduce-window", (operand,), may_reshard(ctx, node))
    return changed


def _select_and_scatter(ctx: Context, node: Node) -> bool:
    operand = node.operands[0]
    window = node.inst.attr("window", ())
    if not partitioned(operand) or any(w.lhs_dilate > 1 for w in window):
        return False
    assert operand.sharding is not None
    return ctx.improve(node, operand.sharding, "select-and-scatter", (operand,), may_reshard(ctx, node))


RULES: dict[str, Rule] = {
    "reduce": _reduce,
    "sort": _sort,
    "custom-call": _custom_call,
    "gather": _gather,
    "scatter": _scatter,
    "reduce-window": _reduce_window,
    "select-and-scatter": _select_and_scatter,
}

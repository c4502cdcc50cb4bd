"""The pass's last step: outputs and parameters propagation may not change get their shardings back.

XLA's ShardingPropagation::Run keeps the entry's root and parameters as annotated unless the module
allows propagation to them (`allow_spmd_sharding_propagation_to_output/parameters`, per element);
an allowed one that would not split evenly stays replicated.
"""

from __future__ import annotations

from planner.propagation.gspmd.context import Context
from planner.propagation.shared.graph import Graph, Node
from planner.sharding.hlo_sharding import HloSharding


def restore_fixed_outputs(
    g: Graph, ctx: Context, saved_root: HloSharding | None, saved_params: dict[int, HloSharding]
) -> None:
    """Fixed outputs and parameters get their shardings back; allowed ones that split unevenly stay replicated."""
    root = g.root(g.entry)
    flags = ctx.options.allow_to_output
    restorable = saved_root is not None and saved_root.is_tuple and len(flags) == len(saved_root.elements)
    if restorable and root.sharding is not None and root.sharding.is_tuple:
        assert saved_root is not None
        leaves = list(root.sharding.elements)
        for i, allowed in enumerate(flags):
            if not allowed and not saved_root.elements[i].is_unknown:
                leaves[i] = saved_root.elements[i]
        root.sharding = HloSharding.tuple_of(tuple(leaves))
    params = g.parameters(g.entry)
    pflags = ctx.options.allow_to_parameters
    if ctx.allow_parameters and len(pflags) == len(params) and len(pflags) > 1:
        for i, p in enumerate(params):
            if not pflags[i]:
                saved = saved_params.get(i)
                p.sharding = saved if saved is not None and not saved.is_unknown else None
    elif ctx.allow_parameters and len(params) == 1 and len(pflags) > 1 and params[0].sharding is not None:
        # One tuple parameter: the flags are per tuple element.
        param = params[0]
        saved = saved_params.get(0)
        current = param.sharding
        assert current is not None
        if current.is_tuple and len(current.elements) == len(pflags):
            leaves = list(current.elements)
            for i, allowed in enumerate(pflags):
                if allowed:
                    continue
                kept = saved.elements[i] if saved is not None and saved.is_tuple else None
                leaves[i] = kept if kept is not None and not kept.is_unknown else HloSharding.replicate()
            param.sharding = HloSharding.tuple_of(tuple(leaves))
    # Allowed outputs and parameters must split evenly, else they stay replicated.
    if ctx.allow_output and root.sharding is not None and (not root.sharding.is_tuple or len(flags) > 1):
        _replicate_if_uneven(root, flags)
    if ctx.allow_parameters:
        for i, p in enumerate(params):
            if p.sharding is None:
                continue
            if len(params) == 1 and len(pflags) > 1 and p.sharding.is_tuple:
                leaves = [
                    HloSharding.replicate() if pflags[k] and not _evenly(leaf, e) else e
                    for k, (leaf, e) in enumerate(zip(p.shape.leaves(), p.sharding.elements))
                ]
                p.sharding = HloSharding.tuple_of(tuple(leaves))
            elif (len(pflags) == 1 or (i < len(pflags) and pflags[i])) and not _evenly(p.shape, p.sharding):
                p.sharding = HloSharding.replicate()


def _evenly(shape: object, s: HloSharding) -> bool:
    from planner.hlo.ir.shapes import ArrayShape, TupleShape

    if s.is_tuple and isinstance(shape, TupleShape):
        return all(_evenly(leaf, e) for leaf, e in zip(shape.leaves(), s.elements))
    if not s.is_tiled:
        return True
    assert isinstance(shape, ArrayShape)
    return all(d % t == 0 for d, t in zip(shape.dims, s.data_tile_dims))


def _replicate_if_uneven(root: Node, flags: tuple[bool, ...]) -> None:
    s = root.sharding
    assert s is not None
    if not s.is_tuple:
        if not _evenly(root.shape, s):
            root.sharding = HloSharding.replicate()
        return
    leaves = list(s.elements)
    for i, (leaf_shape, leaf) in enumerate(zip(root.shape.leaves(), leaves)):
        if (len(flags) == 1 or flags[i]) and not _evenly(leaf_shape, leaf):
            leaves[i] = HloSharding.replicate()
    root.sharding = HloSharding.tuple_of(tuple(leaves))

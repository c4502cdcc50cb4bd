"""Manual computations (`shard_map`): how shardings cross into and out of a manually partitioned body.

JAX's `shard_map` is Shardy's `sdy.manual_computation`; in HLO it is a `xla.sdy.GlobalToLocalShape`
custom call carrying the in-shardings, a call of the body, and a `xla.sdy.LocalToGlobalShape` carrying
the out-shardings, both naming the manual axes. Inside the body the manual axes are gone: an operand
sharded `[{"b", "a"}]` with manual axis b is seen by the body as `[{"a"}]`. Each body argument and
each result is a data-flow edge: the argument's edge propagates from the outer operand, the result's
from the body's returned value. Crossing an edge, the manual axes are taken off (going in) or put back
in front of every dim's free axes (coming out), so the body propagates over free axes only
(`ManualComputationOp::transformTargetSharding` in Shardy).
"""

from __future__ import annotations

from dataclasses import replace

from planner.sharding.shardy import DimSharding, TensorSharding


def erase_manual_axes(sharding: TensorSharding, manual: tuple[str, ...]) -> TensorSharding:
    if not manual:
        return sharding
    dims = tuple(replace(d, axes=tuple(a for a in d.axes if a.name not in manual)) for d in sharding.dims)
    replicated = tuple(a for a in sharding.replicated if a.name not in manual)
    return replace(sharding, dims=dims, replicated=replicated)


def add_free_axes(outer: TensorSharding, new: TensorSharding, manual: tuple[str, ...]) -> TensorSharding:
    """`outer`'s manual axes, then `new`'s axes, per dim; open/closed and priority from `new`."""
    dims = []
    for outer_dim, new_dim in zip(outer.dims, new.dims, strict=False):
        kept = tuple(a for a in outer_dim.axes if a.name in manual)
        dims.append(DimSharding(kept + new_dim.axes, new_dim.is_open, new_dim.priority))
    return TensorSharding(new.mesh, tuple(dims), outer.replicated, outer.unreduced, outer.reduction)

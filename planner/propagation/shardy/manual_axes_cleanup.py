"""Shardy's `sdy-manual-axes-cleanup`: a shard_map's unused manual axes written as replicated.

A manual axis a `shard_map`'s in- or out-sharding does not use is replicated there
(`manual_axes_cleanup.cc`), so that propagation may not put a manual axis on its operands or results:
manual_axes={"a"} with an in-sharding `[{}, {"b"}]` becomes `[{}, {"b"}], replicated={"a"}`.
"""

from __future__ import annotations

from dataclasses import replace

from planner.propagation.shardy import axes as ax
from planner.propagation.shardy.program import Program
from planner.sharding.shardy import AxisRef, TensorSharding


def manual_axes_cleanup(program: Program) -> None:
    def with_unused_replicated(s: TensorSharding, manual: tuple[str, ...]) -> TensorSharding:
        used = {a.name for d in s.dims for a in d.axes} | {a.name for a in (*s.replicated, *s.unreduced)}
        missing = [AxisRef(name) for name in manual if name not in used]
        if not missing:
            return s
        order = [name for name, _ in program.mesh_of(s).axes]
        replicated = sorted((*s.replicated, *missing), key=lambda a: (order.index(a.name), ax.pre_size(a)))
        return replace(s, replicated=tuple(replicated))

    for manual in program.manual:
        manual.in_shardings = [with_unused_replicated(s, manual.manual_axes) for s in manual.in_shardings]
        manual.out_shardings = [with_unused_replicated(s, manual.manual_axes) for s in manual.out_shardings]
        for result in manual.results:
            if result.sharding is not None:
                result.sharding = with_unused_replicated(result.sharding, manual.manual_axes)

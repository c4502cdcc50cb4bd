"""Shardy's `sdy-remove-size-one-axes`: a mesh axis of size 1 splits nothing, so no sharding names it.

Dropped from every dim, replicated and unreduced axis list of every sharding (`@mesh = <["a"=1, "b"=2]>`:
`[{"a", "b"}]` becomes `[{"b"}]`), before propagation: an axis of size 1 would otherwise take a place in
a dim that a real axis could take.
"""

from __future__ import annotations

from dataclasses import replace

from planner.propagation.shardy import axes as ax
from planner.propagation.shardy.program import Program
from planner.sharding.shardy import AxisRef, TensorSharding


def remove_size_one_axes(program: Program) -> None:
    def strip(s: TensorSharding) -> TensorSharding:
        mesh = program.mesh_of(s)

        def keep(refs: tuple[AxisRef, ...]) -> tuple[AxisRef, ...]:
            return tuple(a for a in refs if ax.size_of(a, mesh) != 1)

        dims = tuple(replace(d, axes=keep(d.axes)) for d in s.dims)
        return replace(s, dims=dims, replicated=keep(s.replicated), unreduced=keep(s.unreduced))

    program.map_shardings(strip)

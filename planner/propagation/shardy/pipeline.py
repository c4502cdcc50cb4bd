"""The passes around propagation that change shardings: Shardy's import before, its export after.

`sdy-propagation-pipeline`, which XLA runs, is import -> user-priority propagation -> export. Of the
import passes these change what propagation starts from: size-1 mesh axes are dropped from every
sharding (`remove-size-one-axes`), and a fully closed sharding constraint on a value without a sharding
is applied to that value itself (`apply-sharding-constraints`), as is a manual computation's
in-sharding to its operand. Of the export passes these change what the partitioner reads: a
function's argument and result shardings are cut back to axes that divide their dims
(`update-non-divisible-input-output-shardings`), and every dim is closed (`close-shardings`).
"""

from __future__ import annotations

import math
from dataclasses import replace

from planner.propagation.shardy import axes as ax
from planner.propagation.shardy.apply_sharding_constraints import apply_sharding_constraints
from planner.propagation.shardy.constant_splitting import split_constants
from planner.propagation.shardy.program import Program
from planner.sharding.shardy import AxisRef, DimSharding, SdyMesh, TensorSharding


def _mesh(program: Program, sharding: TensorSharding) -> SdyMesh:
    return sharding.mesh if isinstance(sharding.mesh, SdyMesh) else program.meshes[sharding.mesh]


def _holders(program: Program) -> list[object]:
    return [*program.values, *program.results]


def _map_shardings(program: Program, fn) -> None:  # type: ignore[no-untyped-def]
    for holder in _holders(program):
        s = holder.sharding  # type: ignore[attr-defined]
        if s is not None:
            holder.sharding = fn(s)  # type: ignore[attr-defined]
    for manual in program.manual:
        manual.in_shardings = [fn(s) for s in manual.in_shardings]
        manual.out_shardings = [fn(s) for s in manual.out_shardings]


def remove_size_one_axes(program: Program) -> None:
    def strip(s: TensorSharding) -> TensorSharding:
        mesh = _mesh(program, s)

        def keep(refs: tuple[AxisRef, ...]) -> tuple[AxisRef, ...]:
            return tuple(a for a in refs if ax.size_of(a, mesh) != 1)

        dims = tuple(replace(d, axes=keep(d.axes)) for d in s.dims)
        return replace(s, dims=dims, replicated=keep(s.replicated), unreduced=keep(s.unreduced))

    _map_shardings(program, strip)


def manual_axes_cleanup(program: Program) -> None:
    """A manual axis a `shard_map`'s in- or out-sharding does not use is replicated there
    (`manual_axes_cleanup.cc`): propagation may not put a manual axis on its operands or results."""

    def with_unused_replicated(s: TensorSharding, manual: tuple[str, ...]) -> TensorSharding:
        used = {a.name for d in s.dims for a in d.axes} | {a.name for a in (*s.replicated, *s.unreduced)}
        missing = [AxisRef(name) for name in manual if name not in used]
        if not missing:
            return s
        order = [name for name, _ in _mesh(program, s).axes]
        replicated = sorted((*s.replicated, *missing), key=lambda a: (order.index(a.name), ax.pre_size(a)))
        return replace(s, replicated=tuple(replicated))

    for manual in program.manual:
        manual.in_shardings = [with_unused_replicated(s, manual.manual_axes) for s in manual.in_shardings]
        manual.out_shardings = [with_unused_replicated(s, manual.manual_axes) for s in manual.out_shardings]
        for result in manual.results:
            if result.sharding is not None:
                result.sharding = with_unused_replicated(result.sharding, manual.manual_axes)


def _evenly_sharded(s: TensorSharding, dims: tuple[int, ...], mesh: SdyMesh) -> TensorSharding:
    out = []
    for dim, size in zip(s.dims, dims, strict=False):
        if size % ax.total_size(dim.axes, mesh) == 0:
            out.append(dim)
            continue
        left = size
        kept: list[AxisRef] = []
        for ref in dim.axes:
            gcd = math.gcd(ax.size_of(ref, mesh), left)
            if gcd == 1:
                break
            if ax.size_of(ref, mesh) == gcd:
                kept.append(ref)
                left //= gcd
            else:
                kept.append(AxisRef(ref.name, ax.pre_size(ref), gcd))
                break
        out.append(DimSharding(tuple(kept), dim.is_open))
    return replace(s, dims=tuple(out))


def update_non_divisible_io(program: Program) -> None:
    for value in program.args:
        if value.sharding is not None and value.dims is not None:
            value.sharding = _evenly_sharded(value.sharding, value.dims, _mesh(program, value.sharding))
    for result in program.results:
        if result.sharding is not None and result.value.dims is not None:
            result.sharding = _evenly_sharded(result.sharding, result.value.dims, _mesh(program, result.sharding))


def close_shardings(program: Program) -> None:
    """Every dim closed and the replicated axes dropped, unreduced ones kept (`getClosedLike`)."""

    def close(s: TensorSharding) -> TensorSharding:
        return replace(s, dims=tuple(replace(d, is_open=False) for d in s.dims), replicated=())

    _map_shardings(program, close)


def run_import(program: Program) -> None:
    remove_size_one_axes(program)
    split_constants(program)
    manual_axes_cleanup(program)
    apply_sharding_constraints(program)


def run_export(program: Program) -> None:
    update_non_divisible_io(program)
    close_shardings(program)

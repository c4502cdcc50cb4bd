"""Which axes each factor of one op takes: Shardy's basic and aggressive strategies.

Per factor, the candidate is the longest major prefix of axes compatible across the tensors that map
it (`["a"]` and `["a", "b"]` give `["a", "b"]`; `["a", "b"]` and `["a", "c"]` give `["a"]`). The
direction decides who may lengthen it (operands for forward, results for backward, either for both);
the others can still cut it short. The candidate is then truncated at its first conflicting axis:

- within the factor, for a tensor that would grow: the axis is replicated or unreduced there, the
  factor is closed or has overflow axes, or the sharded size would stop dividing a non-minor-most
  factor (a sub-axis of the gcd is kept instead);
- across factors: *basic* refuses an axis any other factor of any tensor of the op uses; *aggressive*
  checks only the tensor being updated, factor by factor in order of preference (the factor whose
  source tensor is largest first, then for element-wise ops the larger sharded size, then the lower
  source tensor index, then the lower factor index), so that one op may leave its tensors with
  different factors sharded and the partitioner reshards between them.

A tensor's factor sharding only grows: it takes the new axes when its own are a strict prefix of
them. (`basic_factor_propagation.cc`, `aggressive_factor_propagation.cc`.)
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable

from planner.propagation.shardy import axes as ax
from planner.propagation.shardy.projection import FactorSharding, ShardingProjection, TensorFactorShardings
from planner.sharding.shardy import AxisRef, SdyMesh


class Direction(enum.IntFlag):
    NONE = 0
    FORWARD = 1
    BACKWARD = 2
    BOTH = 3


DirectionOf = Callable[[int], Direction]


def _compatible_major(old: list[AxisRef], new: list[AxisRef], can_expand: bool) -> tuple[list[AxisRef], bool]:
    """`getCompatibleMajorAxesInternal`: the common major axes of two lists, and whether more may follow."""
    result: list[AxisRef] = []
    i = 0
    while i < len(old) and i < len(new):
        o, n = old[i], new[i]
        i += 1
        if o.name != n.name:
            return result, False
        if (o.pre_size, o.size) == (n.pre_size, n.size):
            result.append(n)
            continue
        if ax.prefix_of(n, o):
            if i < len(new):
                result.append(n)
                return result, False
            result.append(o)
        elif ax.prefix_of(o, n):
            if not can_expand or i < len(old):
                result.append(o)
                return result, False
            result.append(n)
        else:
            return result, False
    result.extend(old[i:])
    if can_expand:
        result.extend(new[i:])
    return result, can_expand


def compatible_major_axes(projection: ShardingProjection, factor: int, direction: Direction) -> list[AxisRef]:
    if direction == Direction.NONE:
        return []
    if direction == Direction.BACKWARD:
        first, second = projection.results, projection.operands
    else:
        first, second = projection.operands, projection.results
    axes: list[AxisRef] = []
    can_expand = True
    for tensor in first:
        fs = tensor.factors.get(factor)
        if fs is not None:
            axes, can_expand = _compatible_major(axes, fs.axes, can_expand)
    if direction != Direction.BOTH:
        can_expand = False
    for tensor in second:
        fs = tensor.factors.get(factor)
        if fs is not None:
            axes, can_expand = _compatible_major(axes, fs.axes, can_expand)
    return axes


def no_conflicts_across_factors(ref: AxisRef, factors: dict[int, FactorSharding], factor: int) -> AxisRef | None:
    result: AxisRef | None = ref
    for other, sharding in factors.items():
        if other == factor:
            continue
        assert result is not None
        result = ax.prefix_without_overlap_all(result, sharding.overflow)
        if result is None:
            return None
        result = ax.prefix_without_overlap_all(result, sharding.axes)
        if result is None:
            return None
    return result


def no_conflicts_within_factor(
    ref: AxisRef,
    tensor: TensorFactorShardings,
    sharding: FactorSharding,
    prev_sharded_size: int,
    factor_size: int,
    mesh: SdyMesh,
) -> AxisRef | None:
    result = ax.prefix_without_overlap_all(ref, tensor.replicated)
    if result is None:
        return None
    result = ax.prefix_without_overlap_all(result, tensor.unreduced)
    if result is None:
        return None
    if any(ax.contains(present, result) for present in sharding.axes):
        return result
    # Growing the factor by `result`: it must be open, without overflow, and either minor-most or
    # still divided evenly.
    if not sharding.is_closed and not sharding.overflow:
        if sharding.is_minor_most:
            return result
        if factor_size % prev_sharded_size == 0:
            size = ax.size_of(result, mesh)
            gcd = math.gcd(factor_size // prev_sharded_size, size)
            if gcd == size:
                return result
            if gcd != 1:
                return AxisRef(result.name, ax.pre_size(result), gcd)
    if sharding.axes and ax.prefix_of(sharding.axes[-1], result):
        return sharding.axes[-1]
    return None


def truncate_at_conflict(
    axes: list[AxisRef],
    remove_conflicts: Callable[[AxisRef, int], AxisRef | None],
    mesh: SdyMesh,
    conservative: bool,
) -> None:
    prev = 1
    for i, current in enumerate(axes):
        new = remove_conflicts(current, prev)
        if new is None or (conservative and new.pre_size is not None):
            del axes[i:]
            return
        if new != current:
            axes[i] = new
            del axes[i + 1 :]
            return
        prev *= ax.size_of(new, mesh)


def _compatible_prefix(
    ref: AxisRef, projection: ShardingProjection, factor: int, prev: int, factor_size: int, mesh: SdyMesh
) -> AxisRef | None:
    result: AxisRef | None = ref
    for tensor in projection.tensors:
        assert result is not None
        result = no_conflicts_across_factors(result, tensor.factors, factor)
        if result is None:
            return None
        sharding = tensor.factors.get(factor)
        if sharding is not None:
            result = no_conflicts_within_factor(result, tensor, sharding, prev, factor_size, mesh)
            if result is None:
                return None
    return result


class Update:
    """Which operands and results a propagation changed."""

    __slots__ = ("operands", "results")

    def __init__(self, num_operands: int, num_results: int) -> None:
        self.operands = [False] * num_operands
        self.results = [False] * num_results


def propagate_basic(
    projection: ShardingProjection,
    direction_of: DirectionOf,
    factor_sizes: tuple[int, ...],
    mesh: SdyMesh,
    conservative: bool,
    is_elementwise: bool,
) -> Update:
    update = Update(len(projection.operands), len(projection.results))
    for factor, size in enumerate(factor_sizes):
        axes = compatible_major_axes(projection, factor, direction_of(factor))
        truncate_at_conflict(
            axes,
            lambda ref, prev, f=factor, s=size: _compatible_prefix(ref, projection, f, prev, s, mesh),  # type: ignore[misc]
            mesh,
            conservative,
        )
        for i, tensor in enumerate(projection.operands):
            update.operands[i] |= tensor.expand(factor, axes)
        for i, tensor in enumerate(projection.results):
            update.results[i] |= tensor.expand(factor, axes)
    return update


def _source_tensors(
    projection: ShardingProjection, factor_sizes: tuple[int, ...], axes_per_factor: list[list[AxisRef]]
) -> list[tuple[int, int]]:
    """Per factor, (size, index) of the largest tensor already holding a prefix-compatible sharding of it."""
    sources = [(-1, -1)] * len(factor_sizes)
    for index, tensor in enumerate(projection.tensors):
        tensor_size = math.prod(factor_sizes[f] for f in tensor.factors)
        for factor, sharding in tensor.factors.items():
            wanted = axes_per_factor[factor]
            is_source = bool(wanted) and ax.list_prefix_status(wanted, sharding.axes) != ax.NOT_A_PREFIX
            if is_source and tensor_size > sources[factor][0]:
                sources[factor] = (tensor_size, index)
    return sources


def _propagated_axes(
    factor: int,
    tensor: TensorFactorShardings,
    axes_per_factor: list[list[AxisRef]],
    factor_sizes: tuple[int, ...],
    mesh: SdyMesh,
    conservative: bool,
) -> list[AxisRef]:
    sharding = tensor.factors.get(factor)
    if sharding is None:
        return []
    new = list(axes_per_factor[factor])
    truncate_at_conflict(
        new,
        lambda ref, prev: no_conflicts_within_factor(ref, tensor, sharding, prev, factor_sizes[factor], mesh),
        mesh,
        conservative,
    )
    if not ax.is_strict_prefix(sharding.axes, new):
        return []
    # Checked against this tensor's factors as already updated for the factors preferred to this one.
    truncate_at_conflict(
        new, lambda ref, _prev: no_conflicts_across_factors(ref, tensor.factors, factor), mesh, conservative
    )
    return new


def propagate_aggressive(
    projection: ShardingProjection,
    direction_of: DirectionOf,
    factor_sizes: tuple[int, ...],
    mesh: SdyMesh,
    conservative: bool,
    is_elementwise: bool,
) -> Update:
    update = Update(len(projection.operands), len(projection.results))
    axes_per_factor = [compatible_major_axes(projection, f, direction_of(f)) for f in range(len(factor_sizes))]
    if not any(axes_per_factor):
        return update
    sources = _source_tensors(projection, factor_sizes, axes_per_factor)

    def preference(f: int) -> tuple[int, int, int, int]:
        sharded = ax.total_size(axes_per_factor[f], mesh) if is_elementwise else 0
        return (-sources[f][0], -sharded, sources[f][1], f)

    order = sorted(range(len(factor_sizes)), key=preference)
    for i, tensor in enumerate(projection.results):
        changed = False
        for factor in order:
            new = _propagated_axes(factor, tensor, axes_per_factor, factor_sizes, mesh, conservative)
            if new:
                changed |= tensor.expand(factor, new)
        update.results[i] = changed
    for i, tensor in enumerate(projection.operands):
        changed = False
        for factor in order:
            new = _propagated_axes(factor, tensor, axes_per_factor, factor_sizes, mesh, conservative)
            if not new:
                continue
            if is_elementwise:
                # An operand takes from another operand no more than a result that holds part of it.
                for result in projection.results:
                    held = result.factors.get(factor)
                    if held is not None and ax.is_strict_prefix(held.axes, new):
                        new = list(held.axes)
            changed |= tensor.expand(factor, new)
        update.operands[i] = changed
    return update

"""Tensor shardings seen per factor of an op's rule, and back again.

Propagation along an op works on factors, not dims (`rule.py`). Projecting a tensor's sharding fills
each dim's factors with the dim's axes, major to minor, splitting an axis into sub-axes where a factor
takes only part of it. Worked example: rule `([ij]) -> ([i, j]) {i=2, j=4}` on mesh `"x"=4, "y"=2`,
operand sharded `[{"x", "y"}]`: factor i (size 2) takes `"x":(1)2`, the rest of x (`"x":(2)2`) and y go
to j. Were the result to take the same factor shardings, projecting back gives it
`[{"x":(1)2}, {"x":(2)2, "y"}]`.

Non-minor-most factors must be divided evenly: once an axis and a factor are relatively prime, that
axis and every later one are kept as the factor's *overflow* (restored on the way back, never
propagated) and the dim's remaining factors are closed. The minor-most factor takes whatever is left
(padding). Projecting back stops a dim at the first factor that is not fully sharded, since sharding
a later factor would need a strided view. This is `sharding_projection.cc` in Shardy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner.propagation.shardy import axes as ax
from planner.propagation.shardy.rule import OpShardingRule, TensorMapping
from planner.sharding.shardy import AxisRef, DimSharding, SdyMesh, TensorSharding


@dataclass(slots=True)
class FactorSharding:
    axes: list[AxisRef] = field(default_factory=list)
    is_closed: bool = False
    is_minor_most: bool = False
    overflow: list[AxisRef] = field(default_factory=list)


@dataclass(slots=True)
class TensorFactorShardings:
    factors: dict[int, FactorSharding] = field(default_factory=dict)
    replicated: tuple[AxisRef, ...] = ()
    unreduced: tuple[AxisRef, ...] = ()
    reduction: str = "sum"

    def expand(self, factor: int, new_axes: list[AxisRef]) -> bool:
        """Takes `new_axes` for `factor` when the present axes are a strict prefix of them."""
        sharding = self.factors.get(factor)
        if sharding is None or not ax.is_strict_prefix(sharding.axes, new_axes):
            return False
        sharding.axes = list(new_axes)
        return True

    def to_tensor_sharding(
        self, mapping: TensorMapping, factor_sizes: tuple[int, ...], mesh_name: str | SdyMesh, mesh: SdyMesh
    ) -> TensorSharding:
        dims = []
        for dim_factors in mapping:
            closed = False
            dim_axes: list[AxisRef] = []
            for factor in dim_factors:
                sharding = self.factors[factor]
                closed |= sharding.is_closed
                sharded = _add_axes(dim_axes, sharding.axes, mesh)
                if sharding.overflow:
                    # Later factors of this dim were closed when the overflow was found.
                    _add_axes(dim_axes, sharding.overflow, mesh)
                    break
                if sharded < factor_sizes[factor]:
                    break  # a later factor would need a strided view
            dims.append(DimSharding(tuple(dim_axes), is_open=not closed))
        return TensorSharding(mesh_name, tuple(dims), self.replicated, self.unreduced, self.reduction)


def _add_axes(dim_axes: list[AxisRef], new: list[AxisRef], mesh: SdyMesh) -> int:
    """Appends `new` to a dim's axes, merging sub-axes at the factor boundary; the product of their sizes."""
    for i, ref in enumerate(new):
        if i == 0:
            ax.add_axis_or_merge(dim_axes, ref, mesh)
        else:
            dim_axes.append(ref)
    return ax.total_size(new, mesh)


def _remaining(dim_axes: tuple[AxisRef, ...], index: int, mesh: SdyMesh) -> tuple[int, int | None] | None:
    """(size, pre-size if a sub-axis) of the axis at `index`, None past the end (`getAxisRefInfo`)."""
    if index >= len(dim_axes):
        return None
    ref = dim_axes[index]
    return ax.size_of(ref, mesh), ref.pre_size


def _ref(name: str, info: tuple[int, int | None]) -> AxisRef:
    size, pre = info
    return AxisRef(name) if pre is None else AxisRef(name, pre, size)


def _add_remaining(
    out: list[AxisRef], info: tuple[int, int | None] | None, dim_axes: tuple[AxisRef, ...], index: int, mesh: SdyMesh
) -> None:
    while info is not None:
        out.append(_ref(dim_axes[index].name, info))
        index += 1
        info = _remaining(dim_axes, index, mesh)


def project_tensor(
    mapping: TensorMapping,
    sharding: TensorSharding | None,
    factor_sizes: tuple[int, ...],
    mesh: SdyMesh,
    closed_if_missing: bool = False,
) -> TensorFactorShardings:
    result = TensorFactorShardings()
    for dim, dim_factors in enumerate(mapping):
        dim_axes = sharding.dims[dim].axes if sharding is not None else ()
        dim_closed = (not sharding.dims[dim].is_open) if sharding is not None else closed_if_missing
        index = 0
        info = _remaining(dim_axes, index, mesh)
        overflowed = False
        for position, factor in enumerate(dim_factors):
            fs = result.factors.setdefault(factor, FactorSharding())
            fs.is_minor_most = position == len(dim_factors) - 1
            if overflowed:
                fs.is_closed = True
                break
            fs.is_closed = dim_closed
            left = factor_sizes[factor]
            if fs.is_minor_most:
                _add_remaining(fs.axes, info, dim_axes, index, mesh)
                break
            gcd = 1
            while info is not None and (info[0] == 1 or (gcd := math.gcd(left, info[0])) > 1):
                name = dim_axes[index].name
                size, pre = info
                if size > gcd:
                    # Split the axis: this factor takes its major `gcd` part.
                    start = pre if pre is not None else 1
                    fs.axes.append(AxisRef(name, start, gcd))
                    info = (size // gcd, start * gcd)
                    left //= gcd
                else:
                    fs.axes.append(_ref(name, info))
                    left //= size
                    index += 1
                    info = _remaining(dim_axes, index, mesh)
            if left > 1 and info is not None:
                overflowed = True
                _add_remaining(fs.overflow, info, dim_axes, index, mesh)
    if sharding is not None:
        result.replicated = sharding.replicated
        result.unreduced = sharding.unreduced
        result.reduction = sharding.reduction
    return result


@dataclass(slots=True)
class ShardingProjection:
    operands: list[TensorFactorShardings]
    results: list[TensorFactorShardings]

    @property
    def tensors(self) -> list[TensorFactorShardings]:
        return self.operands + self.results

    @classmethod
    def build(
        cls,
        operand_shardings: list[TensorSharding | None],
        result_shardings: list[TensorSharding | None],
        rule: OpShardingRule,
        mesh: SdyMesh,
        closed_if_missing: bool = False,
    ) -> ShardingProjection:
        sizes = rule.factor_sizes
        return cls(
            [
                project_tensor(m, s, sizes, mesh, closed_if_missing)
                for m, s in zip(rule.operand_mappings, operand_shardings, strict=True)
            ],
            [
                project_tensor(m, s, sizes, mesh, closed_if_missing)
                for m, s in zip(rule.result_mappings, result_shardings, strict=True)
            ],
        )

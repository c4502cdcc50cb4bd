"""Projecting dim shardings onto an op's factors and back (`planner.propagation.shardy.projection`)."""

from __future__ import annotations

import pytest

from planner.propagation.shardy.projection import ShardingProjection, project_tensor
from planner.propagation.shardy.rule import OpShardingRule
from planner.sharding.shardy import AxisRef, DimSharding, SdyMesh, TensorSharding

MESH = SdyMesh((("x", 4), ("y", 2)))


def sharding(*dims: tuple[str, ...], is_open: bool = False) -> TensorSharding:
    return TensorSharding("mesh", tuple(DimSharding(tuple(AxisRef(a) for a in d), is_open) for d in dims))


def test_a_merged_dim_splits_an_axis_between_its_factors() -> None:
    # ([ij]) -> ([i, j]) {i=2, j=4}: x (size 4) gives its major 2 to i, the rest and y to j.
    rule = OpShardingRule(factor_sizes=(2, 4), operand_mappings=(((0, 1),),), result_mappings=(((0,), (1,)),))
    operand = project_tensor(rule.operand_mappings[0], sharding(("x", "y")), rule.factor_sizes, MESH)
    assert operand.factors[0].axes == [AxisRef("x", 1, 2)]
    assert operand.factors[1].axes == [AxisRef("x", 2, 2), AxisRef("y")]
    projection = ShardingProjection.build([sharding(("x", "y"))], [None], rule, MESH)
    result = projection.results[0]
    for f in (0, 1):
        assert result.expand(f, projection.operands[0].factors[f].axes)
    back = result.to_tensor_sharding(rule.result_mappings[0], rule.factor_sizes, "mesh", MESH)
    assert [d.axes for d in back.dims] == [(AxisRef("x", 1, 2),), (AxisRef("x", 2, 2), AxisRef("y"))]


@pytest.mark.parametrize(
    ("factor_sizes", "axes", "kept", "overflow"),
    [
        ((4, 3), ("x", "y"), ["x"], []),  # x fills factor i exactly; y goes on to the minor-most factor
        ((6, 4), ("x",), ["x:(1)2"], ["x:(2)2"]),  # gcd(6, 4) = 2: the rest of x overflows the non-minor factor
    ],
    ids=["full_factor_then_next", "non_dividing_axis_overflows"],
)
def test_non_minor_factors_take_what_divides_them(
    factor_sizes: tuple[int, int], axes: tuple[str, ...], kept: list[str], overflow: list[str]
) -> None:
    def ref(text: str) -> AxisRef:
        if ":" not in text:
            return AxisRef(text)
        name, sub = text.split(":")
        pre, size = sub[1:].split(")")
        return AxisRef(name, int(pre), int(size))

    mapping = ((0, 1),)
    projected = project_tensor(mapping, sharding(axes), factor_sizes, MESH)
    assert projected.factors[0].axes == [ref(k) for k in kept]
    if factor_sizes == (4, 3):
        assert projected.factors[1].axes == [AxisRef("y")]  # the minor-most factor takes the rest (padded)
    else:
        assert projected.factors[0].overflow == [ref(o) for o in overflow]
        assert projected.factors[1].is_closed

"""The forms the lit harness writes for what jaxlib's converter refuses or drops: a named computation as the call
Shardy exports it to, a hand-written data-flow edge as its owner's sharding, and an unused sharding constraint
returned so that it reaches HLO."""

from __future__ import annotations

import pytest

from fidelity.dangling_constraints import return_dangling_constraints
from fidelity.named_computations import named_computations_as_calls
from fidelity.written_edges import WrittenEdge, take_written_edges

NAMED = """module {
  sdy.mesh @m = <["a"=2]> loc(#loc1)
  func.func @main(%arg0: tensor<8xf32> loc("l1c1")) -> tensor<8xf32> {
    %1 = sdy.named_computation<"f">(%arg0) in_shardings=[<@m, [{"a"}]>] out_shardings=[<@m, [{}]>] (%a: tensor<8xf32> loc("l5c3")) {
      %2 = stablehlo.tanh %a : tensor<8xf32> loc("l6c5")
      sdy.return %2 : tensor<8xf32> loc("l7c5")
    } : (tensor<8xf32>) -> tensor<8xf32> loc("l4c8")
    return %1 : tensor<8xf32> loc("l9c3")
  } loc(#loc2)
} loc(#loc)
"""


def test_a_named_computation_becomes_a_call_kept_as_a_call() -> None:
    text = named_computations_as_calls(NAMED)
    assert "sdy.named_computation" not in text and "sdy.return" not in text
    assert (
        '%1 = func.call @f_0(%arg0) {mhlo.frontend_attributes = {inlineable = "false"}, '
        'sdy.sharding = #sdy.sharding_per_value<[<@m, [{}]>]>} : (tensor<8xf32>) -> tensor<8xf32> loc("l4c8")'
    ) in text
    assert (
        'func.func private @f_0(%a: tensor<8xf32> {sdy.sharding = #sdy.sharding<@m, [{"a"}]>} loc("l5c3")) '
        "-> tensor<8xf32> {"
    ) in text
    assert '      return %2 : tensor<8xf32> loc("l7c5")' in text
    # The function is inside the module, after main.
    assert text.index("@f_0(%a") > text.index("func.func @main") and text.rstrip().endswith("} loc(#loc)")


EDGES = """module {
  func.func @main(%arg0: tensor<32x32xf32> loc("l1c1")) -> tensor<32x32xf32> {
    %0 = sdy.manual_computation(%arg0) in_shardings=[<@m, [{"b", ?}, {?}]>] out_shardings=[<@m, [{"b", ?}, {?}]>] manual_axes={"b"} (%arg1: tensor<16x32xf32> loc("l9c1")) {
      %2 = sdy.data_flow_edge %arg1 sharding=<@m, [{?}, {?}]> : tensor<16x32xf32> loc(#loc7)
      %3 = stablehlo.add %2, %2 : tensor<16x32xf32> loc(#loc8)
      sdy.return %3 : tensor<16x32xf32> loc(#loc9)
    } : (tensor<32x32xf32>) -> tensor<32x32xf32> loc(#loc5)
    %1 = sdy.data_flow_edge %0 sharding=<@m, [{?}, {"c", ?}]> : tensor<32x32xf32> loc(#loc11)
    return %1 : tensor<32x32xf32> loc(#loc12)
  } loc(#loc3)
} loc(#loc)
#loc5 = loc("l8c8")
#loc7 = loc("l10c10")
#loc8 = loc("l11c10")
#loc9 = loc("l12c5")
#loc11 = loc("l14c8")
#loc12 = loc("l15c3")
"""


def test_written_edges_leave_the_module_and_name_their_owners() -> None:
    text, edges = take_written_edges(EDGES)
    assert "sdy.data_flow_edge" not in text
    assert "stablehlo.add %arg1, %arg1" in text and "return %0 :" in text
    assert edges == [
        WrittenEdge("l10c10", "l8c8", False, 0, "#sdy.sharding<@m, [{?}, {?}]>"),
        WrittenEdge("l14c8", "l8c8", True, 0, '#sdy.sharding<@m, [{?}, {"c", ?}]>'),
    ]


def test_an_edge_on_anything_but_a_shard_map_is_refused_by_name() -> None:
    text = EDGES.replace("%1 = sdy.data_flow_edge %0", "%1 = sdy.data_flow_edge %arg0")
    with pytest.raises(ValueError, match="%arg0, which owns no shard_map edge"):
        take_written_edges(text)


DANGLING = """module {
  sdy.mesh @mesh = <["a"=2, "b"=2]> loc(#loc1)
  func.func @main(%arg0: tensor<8x8xf32> loc("l1c1")) -> (tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a"}, {}]>}) {
    %0 = stablehlo.add %arg0, %arg0 : tensor<8x8xf32> loc(#loc4)
    %1 = sdy.sharding_constraint %0 <@mesh, [{}, {"b"}]> : tensor<8x8xf32> loc(#loc5)
    %2 = sdy.sharding_constraint %0 <@mesh, [{"a"}, {}]> : tensor<8x8xf32> loc(#loc6)
    %3 = stablehlo.while(%iterArg = %2) : tensor<8x8xf32>
    cond {
      %9 = sdy.sharding_constraint %iterArg <@mesh, [{}, {"b"}]> : tensor<8x8xf32> loc(#loc7)
      %c = stablehlo.constant dense<true> : tensor<i1>
      stablehlo.return %c : tensor<i1> loc(#loc8)
    } do {
      stablehlo.return %iterArg : tensor<8x8xf32> loc(#loc8)
    } loc(#loc9)
    return %3 : tensor<8x8xf32> loc(#loc10)
  } loc(#loc2)
} loc(#loc)
"""


def test_an_unused_constraint_is_returned_last_and_one_inside_a_region_is_left() -> None:
    text = return_dangling_constraints(DANGLING)
    assert ('-> (tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a"}, {}]>}, tensor<8x8xf32>) {') in text
    assert "    return %3, %1 : tensor<8x8xf32>, tensor<8x8xf32> loc(#loc10)" in text
    # The loop condition's constraint cannot be returned from main; its region's return is untouched.
    assert "      stablehlo.return %c : tensor<i1> loc(#loc8)" in text
    assert return_dangling_constraints(text) == text


def test_an_unused_constraint_reaches_hlo_and_keeps_both_effects() -> None:
    """Shardy's test: two different constraints on one value, one unused. Neither is applied to the value
    (they differ), and each propagates its axis back into it."""
    from fidelity.shardy_lit import run_case

    module = """module {
  sdy.mesh @mesh = <["a"=2, "b"=2]> loc("l1c1")
  func.func @main(%arg0: tensor<8x8xf32> loc("l2c1")) -> tensor<8x8xf32> {
    %0 = stablehlo.add %arg0, %arg0 : tensor<8x8xf32> loc("l4c8")
    %1 = sdy.sharding_constraint %0 <@mesh, [{}, {"b"}]> : tensor<8x8xf32> loc("l5c8")
    %2 = sdy.sharding_constraint %0 <@mesh, [{"a"}, {}]> : tensor<8x8xf32> loc("l6c8")
    return %2 : tensor<8x8xf32> loc("l7c3")
  } loc("l2c2")
} loc("l0c0")
"""
    case = {"name": "dangling", "source": "t.mlir", "module": module,
            "pipeline": "builtin.module(func.func(sdy-apply-sharding-constraints),sdy-aggressive-propagate)",
            "expect": {"l4c8": '#sdy.sharding_per_value<[<@mesh, [{"a", ?}, {"b", ?}]>]>',
                       "l5c8": '#sdy.sharding<@mesh, [{}, {"b"}]>'}}  # fmt: skip
    result = run_case(case)
    assert result.error is None, result.error
    assert not result.missed, {k: result.got.get(k) for k in result.missed}

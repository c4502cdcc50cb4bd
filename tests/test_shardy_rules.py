"""Shardy's sharding rule registry, ported: every rule Shardy's own registry tests print, and a table of the ops
training steps lean on.

The reference rules come from `op_sharding_rule_registry*.mlir` at openxla/shardy@5b3b2894 (jaxlib 0.7.1's
Shardy), one expected `#sdy.op_sharding_rule<...>` per op location, and are asked of that release
(`ShardyRelease.JAXLIB_0_7`); jaxlib 0.12's are in `test_shardy_rules_jax012.py`, and the rules that differ
between the two in `test_shardy_rule_releases.py`. Each case's StableHLO module is converted to HLO by
the installed jaxlib, as JAX hands it to XLA, so the cases run where jaxlib 0.7 is installed, and every HLO
instruction keeps its op's location as `metadata={op_name="l541c8"}`.

Which instruction is the op. jaxlib may write one StableHLO op as several HLO instructions under its
location: a multi-operand collective packs its operands into a tuple and unpacks them again (all_gather:
tuple, get-tuple-element, all-gather, get-tuple-element), a clamp of scalar bounds broadcasts the bounds
first, and a region's block arguments and body ops may carry the op's location too (a reduce's reducer
parameters and add). The op itself is the last instruction under that location in the printed module
that is neither a parameter nor a tuple nor a get-tuple-element: what the converter writes before it
prepares its operands, what comes after unpacks its results, and a region's computation is printed before
the one that calls it. Its operands are read through what the converter made for it: a get-tuple-element
of the op's own operand tuple stands for that tuple's element, and a broadcast under the op's location for
the value it broadcasts (the clamp's scalar bounds), so the rule sees the StableHLO op's operands.

Five expected rules have no HLO instruction that is their op; each is an xfail (strict) that says why, and
the table below checks the rule on the op as StableHLO writes it where HLO can carry it. The table's rules
are the same in every release the registry knows, and each row is asked of each.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest
from conftest import SHARED

from planner import parse_hlo
from planner.errors import HloParseError
from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.hlo.text.stablehlo_text import read_stablehlo
from planner.propagation.shardy.registry import no_rule_reason, sharding_rule
from planner.propagation.shardy.registry_rule_text import parse_rule
from planner.propagation.shardy.release import ShardyRelease
from planner.propagation.shardy.rule import OpShardingRule
from planner.sharding.shardy import ShardyTextError

CASES = SHARED / "shardy_cases" / "shardy_propagation_cases.json"
RELEASE = ShardyRelease.JAXLIB_0_7

# The NOT_IN_HLO reasons are jaxlib 0.7's converter's: another jaxlib writes some of these ops otherwise.
needs_the_cases_jaxlib = pytest.mark.skipif(
    ShardyRelease.installed() is not RELEASE,
    reason="these modules are read through the installed jaxlib's converter, and the cases' xfails are jaxlib 0.7's",
)

# (case id, op location) -> why no HLO instruction carries the expected rule. `raises` is what the test
# meets instead: the converter's refusal, or a rule that differs.
NOT_IN_HLO: dict[tuple[str, str], tuple[str, type[Exception]]] = {
    ("registry/custom_call_erf", "l416c8"): (
        "jaxlib 0.7.1 refuses to convert custom_call @mhlo.erf to HLO ('failed to legalize operation "
        "stablehlo.custom_call that was explicitly marked illegal'); HLO's erf and a custom-call @mhlo.erf are "
        "in the table",
        HloParseError,
    ),
    ("registry/broadcast_in_dim_size_zero_dim", "l99c8"): (
        "jaxlib writes a broadcast_in_dim of zero elements as an HLO reshape, and Shardy gives a reshape of zero "
        "elements no rule; the broadcast is in the table",
        AssertionError,
    ),
    ("registry/broadcast_in_dim_input_dim_expanded", "l113c8"): (
        "HLO's broadcast cannot expand a size-1 dim: jaxlib writes broadcast, reshape, broadcast, none of which "
        "is the op; the broadcast as StableHLO writes it is in the table",
        AssertionError,
    ),
    ("registry/all_to_all_same_dimension", "l58c10"): (
        "jaxlib writes a multi-operand all_to_all as HLO's tuple all-to-all, which has no split or concat "
        "dimension (it exchanges whole operands): no rule; the array form is in the table",
        AssertionError,
    ),
    ("registry/all_to_all_different_dimensions", "l45c10"): (
        "jaxlib writes a multi-operand all_to_all as HLO's tuple all-to-all, which has no split or concat "
        "dimension, and gives its results the operands' shapes: no rule",
        AssertionError,
    ),
}


@cache
def rule_cases() -> tuple[dict[str, Any], ...]:
    cases = json.loads(CASES.read_text())["cases"]
    return tuple(c for c in cases if c["kind"] == "rule")


def case_id(case: dict[str, Any]) -> str:
    """`op_sharding_rule_registry_conservative.mlir::concat` -> `registry_conservative/concat`."""
    file, _, function = case["name"].partition("::")
    return f"{file.removesuffix('.mlir').removeprefix('op_sharding_rule_')}/{function}"


def expected_rules(
    cases: tuple[dict[str, Any], ...] | None = None,
    not_in_hlo: dict[tuple[str, str], tuple[str, type[Exception]]] = NOT_IN_HLO,
) -> list[Any]:
    params = []
    for case in rule_cases() if cases is None else cases:
        for location, expected in case["rules"].items():
            known = not_in_hlo.get((case_id(case), location))
            marks = [pytest.mark.xfail(reason=known[0], raises=known[1], strict=True)] if known else []
            params.append(pytest.param(case, location, expected, id=f"{case_id(case)}@{location}", marks=marks))
    return params


@cache
def converted(module_text: str) -> HloModule:
    return parse_hlo(read_stablehlo(module_text))


def op_instruction(module: HloModule, location: str) -> tuple[Computation, Instruction]:
    """The HLO instruction that is the StableHLO op at `location` (see the module docstring)."""
    found = [
        (comp, inst)
        for comp in module.computations
        for inst in comp
        if inst.metadata is not None
        and inst.metadata.op_name == location
        and inst.opcode not in ("parameter", "tuple", "get-tuple-element")
    ]
    assert found, f"no HLO instruction carries location {location}"
    return found[-1]


def operand_shapes(comp: Computation, inst: Instruction, location: str) -> list[ArrayShape]:
    shapes = []
    for name in inst.operands:
        operand = comp[name]
        if operand.metadata is not None and operand.metadata.op_name == location:
            if operand.opcode == "get-tuple-element":
                operand = comp[comp[operand.operands[0]].operands[operand.attr("index")]]
            elif operand.opcode == "broadcast":
                operand = comp[operand.operands[0]]
        assert isinstance(operand.shape, ArrayShape), f"{operand.name} is a tuple"
        shapes.append(operand.shape)
    return shapes


def text_of(rule: OpShardingRule | None) -> str | None:
    return rule.to_text() if rule is not None else None


def conservative(case: dict[str, Any]) -> bool:
    return "conservative-propagation=true" in case["pipeline"]


def rule_at(case: dict[str, Any], location: str, release: ShardyRelease) -> str | None:
    """The rule `release`'s registry gives the op at `location` of `case`, as Shardy prints it."""
    module = converted(case["module"])
    comp, inst = op_instruction(module, location)
    return rule_text(module, comp, inst, location, conservative(case), release)


def rule_text(
    module: HloModule, comp: Computation, inst: Instruction, location: str, conservative: bool, release: ShardyRelease
) -> str | None:
    """The rule `release`'s registry gives `inst`, the op at `location`, as Shardy prints it."""
    operands = operand_shapes(comp, inst, location)
    return text_of(sharding_rule(inst, operands, inst.shape.leaves(), conservative=conservative, computation=comp,
                                 module=module, release=release))  # fmt: skip


def assert_no_rule_anywhere(case: dict[str, Any], release: ShardyRelease) -> None:
    module = converted(case["module"])
    ops = [inst for inst in module.entry if inst.opcode not in ("parameter", "tuple", "get-tuple-element")]
    assert ops
    for inst in ops:
        shapes = [module.entry[o].array_shape for o in inst.operands]
        rule = sharding_rule(
            inst, shapes, inst.shape.leaves(), computation=module.entry, module=module, release=release
        )
        assert rule is None


@needs_the_cases_jaxlib
@pytest.mark.parametrize(("case", "location", "expected"), expected_rules())
def test_rule_equals_shardys(case: dict[str, Any], location: str, expected: str) -> None:
    assert rule_at(case, location, RELEASE) == expected


@needs_the_cases_jaxlib
@pytest.mark.parametrize(
    "case", [pytest.param(c, id=case_id(c)) for c in rule_cases() if not c["rules"]]
)  # fmt: skip
def test_no_rule_where_shardy_prints_none(case: dict[str, Any]) -> None:
    """A reshape of zero elements and an unknown custom call: Shardy attaches no rule, nor do we."""
    assert_no_rule_anywhere(case, RELEASE)


def every_rule_text() -> list[str]:
    """The rules of both releases' cases: jaxlib 0.7.1's and jaxlib 0.12's registry tests."""
    texts = set()
    for path in (CASES, SHARED / "shardy_cases_jax012" / "shardy_propagation_cases.json"):
        for case in json.loads(path.read_text())["cases"]:
            texts.update(case.get("rules", {}).values())
    return sorted(texts)


@pytest.mark.parametrize("expected", every_rule_text())
def test_rule_text_reads_back(expected: str) -> None:
    assert parse_rule(expected).to_text() == expected


def test_malformed_rule_text_says_where() -> None:
    text = "#sdy.op_sharding_rule<([i, 3])->([i]) {i=4}>"
    with pytest.raises(ShardyTextError, match="expected a factor symbol") as error:
        parse_rule(text)
    assert error.value.offset == text.index("3")


# --- The table: ops the training steps use most, and the forms the cases leave out ---------------------------
#
# Each row is an entry computation whose instruction `op` is the one ruled on. The expected rules are Shardy's
# (`sdy-populate-op-sharding-rules` of jaxlib 0.7.1 and of jaxlib 0.12, alike) on the StableHLO XLA's Shardy
# pass makes of the same HLO: there `Sharding` custom calls are `sdy.sharding_constraint`s, and HLO's `erf`
# and `topk` are custom calls @mhlo.erf and @mhlo.topk. The rows whose rule differs between releases are
# in `test_shardy_rule_releases.py`.

COMPUTATIONS = """
%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%less (a: f32[], b: f32[], c: s32[], d: s32[]) -> pred[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %c = s32[] parameter(2)
  %d = s32[] parameter(3)
  ROOT %lt = pred[] compare(%a, %b), direction=LT
}

%less1 (e: f32[], f: f32[]) -> pred[] {
  %e = f32[] parameter(0)
  %f = f32[] parameter(1)
  ROOT %lt1 = pred[] compare(%e, %f), direction=LT
}

%argmax (v0: f32[], i0: s32[], v1: f32[], i1: s32[]) -> (f32[], s32[]) {
  %v0 = f32[] parameter(0)
  %i0 = s32[] parameter(1)
  %v1 = f32[] parameter(2)
  %i1 = s32[] parameter(3)
  %ge = pred[] compare(%v0, %v1), direction=GE
  %v = f32[] select(%ge, %v0, %v1)
  %i = s32[] select(%ge, %i0, %i1)
  ROOT %vi = (f32[], s32[]) tuple(%v, %i)
}
"""

R = "#sdy.op_sharding_rule"
TABLE = [
    # Attention and MLP matmuls, forward and backward.
    ("dot_attention_scores", """
  q = bf16[2,4,16,8] parameter(0)
  k = bf16[2,4,16,8] parameter(1)
  ROOT op = bf16[2,4,16,16] dot(q, k), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,1}, rhs_contracting_dims={3}""",
     f"{R}<([i, j, k, m], [i, j, l, m])->([i, j, k, l]) {{i=2, j=4, k=16, l=16, m=8}} reduction={{m}}>"),
    ("dot_attention_values", """
  a = bf16[2,4,16,16] parameter(0)
  v = bf16[2,4,16,8] parameter(1)
  ROOT op = bf16[2,4,16,8] dot(a, v), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,1}, rhs_contracting_dims={2}""",
     f"{R}<([i, j, k, m], [i, j, m, l])->([i, j, k, l]) {{i=2, j=4, k=16, l=8, m=16}} reduction={{m}}>"),
    ("dot_mlp_projection", """
  x = f32[2,16,32] parameter(0)
  w = f32[32,64] parameter(1)
  ROOT op = f32[2,16,64] dot(x, w), lhs_contracting_dims={2}, rhs_contracting_dims={0}""",
     f"{R}<([i, j, l], [l, k])->([i, j, k]) {{i=2, j=16, k=64, l=32}} reduction={{l}}>"),
    ("dot_weight_gradient", """
  x = f32[2,16,32] parameter(0)
  g = f32[2,16,64] parameter(1)
  ROOT op = f32[32,64] dot(x, g), lhs_contracting_dims={0,1}, rhs_contracting_dims={0,1}""",
     f"{R}<([k, l, i], [k, l, j])->([i, j]) {{i=32, j=64, k=2, l=16}} reduction={{k, l}}>"),
    # Reshapes around attention heads.
    ("reshape_split_heads", """
  x = f32[2,16,32] parameter(0)
  ROOT op = f32[2,16,4,8] reshape(x)""",
     f"{R}<([i, j, kl])->([i, j, k, l]) {{i=2, j=16, k=4, l=8}}>"),
    ("reshape_merge_heads", """
  x = f32[2,16,4,8] parameter(0)
  ROOT op = f32[2,16,32] reshape(x)""",
     f"{R}<([i, j, k, l])->([i, j, kl]) {{i=2, j=16, k=4, l=8}}>"),
    ("reshape_flatten_tokens", """
  x = f32[2,16,32] parameter(0)
  ROOT op = f32[32,32] reshape(x)""",
     f"{R}<([i, j, k])->([ij, k]) {{i=2, j=16, k=32}}>"),
    # Broadcasts: a bias, a scalar, a transposing one; and two only StableHLO writes (see NOT_IN_HLO).
    ("broadcast_bias", """
  b = f32[32] parameter(0)
  ROOT op = f32[2,16,32] broadcast(b), dimensions={2}""",
     f"{R}<([k])->([i, j, k]) {{i=2, j=16, k=32}}>"),
    ("broadcast_scalar", """
  s = f32[] parameter(0)
  ROOT op = f32[2,16] broadcast(s), dimensions={}""",
     f"{R}<([])->([i, j]) {{i=2, j=16}}>"),
    ("broadcast_transposing", """
  x = f32[16,2] parameter(0)
  ROOT op = f32[2,4,16] broadcast(x), dimensions={2,0}""",
     f"{R}<([k, i])->([i, j, k]) {{i=2, j=4, k=16}}>"),
    ("broadcast_expanding_size_one_dim_as_stablehlo_writes_it", """
  x = f32[2,1,13] parameter(0)
  ROOT op = f32[2,64,13] broadcast(x), dimensions={0,1,2}""",
     f"{R}<([i, j, l])->([i, k, l]) {{i=2, j=1, k=64, l=13}}>"),
    ("broadcast_of_zero_elements", """
  x = f32[2,13,0] parameter(0)
  ROOT op = f32[2,64,13,0] broadcast(x), dimensions={0,2,3}""",
     f"{R}<([i, k, l])->([i, j, k, l]) {{i=2, j=64, k=13, l=0}}>"),
    # Reductions: a norm's mean, the loss, a variadic argmax.
    ("reduce_last_dim", """
  x = f32[2,16,32] parameter(0)
  z = f32[] constant(0)
  ROOT op = f32[2,16] reduce(x, z), dimensions={2}, to_apply=add""",
     f"{R}<([i, j, k], [])->([i, j]) {{i=2, j=16, k=32}} reduction={{k}}>"),
    ("reduce_loss_to_scalar", """
  x = f32[2,16] parameter(0)
  z = f32[] constant(0)
  ROOT op = f32[] reduce(x, z), dimensions={0,1}, to_apply=add""",
     f"{R}<([i, j], [])->([]) {{i=2, j=16}} reduction={{i, j}}>"),
    ("reduce_argmax_variadic", """
  x = f32[4,16] parameter(0)
  i = s32[4,16] parameter(1)
  z = f32[] constant(-inf)
  zi = s32[] constant(0)
  ROOT op = (f32[4], s32[4]) reduce(x, i, z, zi), dimensions={1}, to_apply=argmax""",
     f"{R}<([i, j], [i, j], [], [])->([i], [i]) {{i=4, j=16}} reduction={{j}}>"),
    # A scanned step reads one layer's weights and writes one layer's gradients.
    ("dynamic_slice_scan_layer_weights", """
  w = f32[3,32,64] parameter(0)
  l = s32[] parameter(1)
  z = s32[] constant(0)
  ROOT op = f32[1,32,64] dynamic-slice(w, l, z, z), dynamic_slice_sizes={1,32,64}""",
     f"{R}<([i, j, k], [], [], [])->([i, j, k]) {{i=3, j=32, k=64}} need_replication={{i}} blocked_propagation={{i}}>"),
    # Embedding lookup and its gradient; the loss's take_along_axis.
    ("gather_embedding_lookup", """
  e = f32[100,32] parameter(0)
  t = s32[2,16,1] parameter(1)
  ROOT op = f32[2,16,32] gather(e, t), offset_dims={2}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=2, slice_sizes={1,32}""",
     f"{R}<([l, k], [i, j, m])->([i, j, k]) {{i=2, j=16, k=32, l=100, m=1}} reduction={{l}} need_replication={{m}}>"),
    ("scatter_add_embedding_gradient", """
  e = f32[100,32] parameter(0)
  t = s32[2,16,1] parameter(1)
  u = f32[2,16,32] parameter(2)
  ROOT op = f32[100,32] scatter(e, t, u), update_window_dims={2}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=2, to_apply=add""",
     f"{R}<([l, k], [i, j, m], [i, j, k])->([l, k]) {{i=2, j=16, k=32, l=100, m=1}} reduction={{i, j}} need_replication={{m}}>"),
    ("gather_take_along_axis", """
  x = f32[2,16,100] parameter(0)
  i = s32[2,16,1] parameter(1)
  ROOT op = f32[2,16] gather(x, i), offset_dims={}, collapsed_slice_dims={2}, start_index_map={2}, operand_batching_dims={0,1}, start_indices_batching_dims={0,1}, index_vector_dim=2, slice_sizes={1,1,1}""",
     f"{R}<([i, j, k], [i, j, l])->([i, j]) {{i=2, j=16, k=100, l=1}} reduction={{k}} need_replication={{l}}>"),
    ("transpose_heads", """
  x = f32[2,16,4,8] parameter(0)
  ROOT op = f32[2,4,16,8] transpose(x), dimensions={0,2,1,3}""",
     f"{R}<([i, k, j, l])->([i, j, k, l]) {{i=2, j=4, k=16, l=8}}>"),
    # Sorting and top-k.
    ("sort_argsort", """
  x = f32[4,16] parameter(0)
  i = s32[4,16] parameter(1)
  ROOT op = (f32[4,16], s32[4,16]) sort(x, i), dimensions={1}, to_apply=less""",
     f"{R}<([i, j], [i, j])->([i, j], [i, j]) {{i=4, j=16}} need_replication={{j}}>"),
    ("sort_along_its_only_dim", """
  x = f32[1,16] parameter(0)
  ROOT op = f32[1,16] sort(x), dimensions={1}, to_apply=less1""",
     f"{R}<([i, j])->([i, j]) {{i=1, j=16}} need_replication={{j}} blocked_propagation={{j}}>"),
    ("topk", """
  x = f32[4,64] parameter(0)
  ROOT op = (f32[4,8], s32[4,8]) topk(x), k=8, largest=true""",
     f"{R}<([i, j])->([i, j], [i, j]) {{i=4, j=64}} need_replication={{j}} blocked_propagation={{j}}>"),
    ("rng_bit_generator", """
  s = u64[2] parameter(0)
  ROOT op = (u64[2], u32[4,8]) rng-bit-generator(s), algorithm=rng_default""",
     f"{R}<([i])->([i], [j, k]) {{i=2, j=4, k=8}} need_replication={{i}} blocked_propagation={{i}}>"),
    # Collectives.
    ("all_gather", """
  x = f32[2,16] parameter(0)
  ROOT op = f32[8,16] all-gather(x), dimensions={0}, replica_groups={{0,1,2,3}}""",
     f"{R}<([j, i])->([k, i]) {{i=16, j=2, k=8}} need_replication={{j, k}}>"),
    ("all_to_all_array_form", """
  x = f32[8,16] parameter(0)
  ROOT op = f32[8,16] all-to-all(x), dimensions={0}, replica_groups={{0,1,2,3}}""",
     f"{R}<([j, i])->([k, i]) {{i=16, j=8, k=8}} need_replication={{j, k}}>"),
    ("reduce_scatter", """
  x = f32[8,16] parameter(0)
  ROOT op = f32[2,16] reduce-scatter(x), dimensions={0}, replica_groups={{0,1,2,3}}, to_apply=add""",
     f"{R}<([j, i])->([k, i]) {{i=16, j=8, k=2}} need_replication={{j, k}}>"),
    ("all_reduce", """
  x = f32[8,16] parameter(0)
  ROOT op = f32[8,16] all-reduce(x), replica_groups={{0,1,2,3}}, to_apply=add""",
     f"{R}<([i, j])->([i, j]) {{i=8, j=16}}>"),
    ("collective_permute", """
  x = f32[8,16] parameter(0)
  ROOT op = f32[8,16] collective-permute(x), source_target_pairs={{0,1},{1,0}}""",
     f"{R}<([i, j])->([i, j]) {{i=8, j=16}}>"),
    # Linear algebra and transforms.
    ("cholesky", """
  a = f32[4,8,8] parameter(0)
  ROOT op = f32[4,8,8] cholesky(a), lower=true""",
     f"{R}<([i, j, k])->([i, j, k]) {{i=4, j=8, k=8}} need_replication={{j, k}}>"),
    ("triangular_solve_right_side_transposed", """
  a = f32[4,5,5] parameter(0)
  b = f32[4,3,5] parameter(1)
  ROOT op = f32[4,3,5] triangular-solve(a, b), lower=true, transpose_a=TRANSPOSE""",
     f"{R}<([i, k, l], [i, j, k])->([i, j, l]) {{i=4, j=3, k=5, l=5}} need_replication={{j, k, l}}>"),
    ("triangular_solve_left_side_adjoint", """
  a = f32[4,5,5] parameter(0)
  b = f32[4,5,3] parameter(1)
  ROOT op = f32[4,5,3] triangular-solve(a, b), left_side=true, lower=true, transpose_a=ADJOINT""",
     f"{R}<([i, l, j], [i, j, k])->([i, l, k]) {{i=4, j=5, k=3, l=5}} need_replication={{j, k, l}}>"),
    ("fft_rfft_truncates_last_dim", """
  x = f32[4,16] parameter(0)
  ROOT op = c64[4,9] fft(x), fft_type=RFFT, fft_length={16}""",
     f"{R}<([i, j])->([i, j]) {{i=4, j=16}} need_replication={{j}} blocked_propagation={{j}}>"),
    ("convolution_feature_groups", """
  x = f32[2,4,16,16] parameter(0)
  k = f32[8,2,3,3] parameter(1)
  ROOT op = f32[2,8,7,7] convolution(x, k), window={size=3x3 stride=2x2}, dim_labels=bf01_oi01->bf01, feature_group_count=2""",
     f"{R}<([i, no, jk, lm], [np, o, k, m])->([i, np, j, l]) {{i=2, j=7, k=2, l=7, m=2, n=2, o=2, p=4}} reduction={{k, m, o}} permutation={{j, l}}>"),
    # Windows, slices and pads outside the cases' modes.
    ("reduce_window_max_pool", """
  x = f32[2,16,16] parameter(0)
  z = f32[] constant(-inf)
  ROOT op = f32[2,8,8] reduce-window(x, z), window={size=1x2x2 stride=1x2x2}, to_apply=add""",
     f"{R}<([i, j, k], [])->([i, j, k]) {{i=2, j=8, k=8}} permutation={{j, k}}>"),
    ("pad_aggressive", """
  x = f32[28,28,16] parameter(0)
  z = f32[] constant(0)
  ROOT op = f32[30,32,16] pad(x, z), padding=1_1x2_2x0_0""",
     f"{R}<([i, j, k], [])->([i, j, k]) {{i=28, j=28, k=16}} permutation={{i, j}}>"),
    ("concatenate_array_with_its_slice", """
  x = f32[4,8] parameter(0)
  s = f32[4,2] slice(x), slice={[0:4], [0:2]}
  ROOT op = f32[4,10] concatenate(x, s), dimensions={1}""",
     f"{R}<([i, j], [i, j])->([i, j]) {{i=4, j=10}} permutation={{j}}>"),
    ("select", """
  p = pred[4,8] parameter(0)
  x = f32[4,8] parameter(1)
  ROOT op = f32[4,8] select(p, x, x)""",
     f"{R}<([i, j], [i, j], [i, j])->([i, j]) {{i=4, j=8}}>"),
    ("bitcast_convert_widening", """
  x = u16[4,8,2] parameter(0)
  ROOT op = f32[4,8] bitcast-convert(x)""",
     f"{R}<([i, j, k])->([i, j]) {{i=4, j=8, k=2}} need_replication={{k}}>"),
    ("erf", """
  x = f32[4,8] parameter(0)
  ROOT op = f32[4,8] erf(x)""",
     f"{R}<([i, j])->([i, j]) {{i=4, j=8}}>"),
    # Custom calls.
    ("custom_call_sharding_constraint", """
  x = f32[8,16] parameter(0)
  ROOT op = f32[8,16] custom-call(x), custom_call_target="Sharding", sharding={devices=[2,1]<=[2]}""",
     f"{R}<([i, j])->([i, j]) {{i=8, j=16}}>"),
    ("custom_call_mhlo_erf", """
  x = f32[8,16] parameter(0)
  ROOT op = f32[8,16] custom-call(x), custom_call_target="mhlo.erf\"""",
     f"{R}<([i, j])->([i, j]) {{i=8, j=16}}>"),
    ("custom_call_eigh", """
  a = f32[4,8,8] parameter(0)
  ROOT op = (f32[4,8,8], f32[4,8]) custom-call(a), custom_call_target="Eigh\"""",
     f"{R}<([i, j, k])->([i, j, k], [i, k]) {{i=4, j=8, k=8}}>"),
    ("custom_call_approx_top_k", """
  x = f32[4,64] parameter(0)
  i = s32[4,64] parameter(1)
  z = f32[] constant(-inf)
  zi = s32[] constant(-1)
  ROOT op = (f32[4,8], s32[4,8]) custom-call(x, i, z, zi), custom_call_target="ApproxTopK", called_computations={argmax}""",
     f"{R}<([i, j], [i, j], [], [])->([i, k], [i, k]) {{i=4, j=64, k=8}} need_replication={{k}} blocked_propagation={{k}}>"),
    ("custom_call_bringing_its_own_rule", """
  x = f32[4,2] parameter(0)
  ROOT op = f32[2,4] custom-call(x), custom_call_target="foo", frontend_attributes={xla.sdy.sharding_rule="#sdy.op_sharding_rule<([i, j])->([j, i]) {i=4, j=2}, custom>"}""",
     f"{R}<([i, j])->([j, i]) {{i=4, j=2}}, custom>"),
    # No rule: propagation stops here, as in Shardy.
    ("custom_call_tpu_kernel", """
  x = f32[8,16] parameter(0)
  ROOT op = f32[8,16] custom-call(x), custom_call_target="tpu_custom_call\"""", None),
    ("custom_call_full_to_shard_shape", """
  x = f32[8,16] parameter(0)
  ROOT op = f32[4,16] custom-call(x), custom_call_target="SPMDFullToShardShape", sharding={manual}""", None),
    ("custom_call_unknown", """
  x = f32[8,16] parameter(0)
  ROOT op = f32[8,16] custom-call(x), custom_call_target="my_kernel\"""", None),
    ("all_to_all_tuple_form", """
  x = f32[8,16] parameter(0)
  y = f32[8,16] parameter(1)
  ROOT op = (f32[8,16], f32[8,16]) all-to-all(x, y), replica_groups={{0,1}}""", None),
    ("iota", """
  ROOT op = s32[8,16] iota(), iota_dimension=1""", None),
    ("constant", """
  ROOT op = f32[2] constant({1, 2})""", None),
    # XLA imports HLO's copy as `mhlo.copy`, pointwise by XLA's own extension (`registry_xla`).
    ("copy", """
  x = f32[8,16] parameter(0)
  ROOT op = f32[8,16] copy(x)""", "#sdy.op_sharding_rule<([i, j])->([i, j]) {i=8, j=16}>"),
]  # fmt: skip

# Rows run in conservative mode.
CONSERVATIVE_TABLE = [
    ("slice", """
  x = f32[32,4,8] parameter(0)
  ROOT op = f32[32,1,4] slice(x), slice={[0:32], [1:2], [0:8:2]}""",
     f"{R}<([i, j, k])->([i, j, k]) {{i=32, j=4, k=8}} permutation={{j, k}} blocked_propagation={{j, k}}>"),
    ("convolution_leaves_out_spatial_dims", """
  x = f32[2,4,16,16] parameter(0)
  k = f32[8,2,3,3] parameter(1)
  ROOT op = f32[2,8,7,7] convolution(x, k), window={size=3x3 stride=2x2}, dim_labels=bf01_oi01->bf01, feature_group_count=2""",
     f"{R}<([i, jk, m, n], [jl, k, o, p])->([i, jl, q, r]) {{i=2, j=2, k=2, l=4, m=1, n=1, o=1, p=1, q=1, r=1}} reduction={{k}}>"),
]  # fmt: skip


def rule_of_row(
    body: str, conservative: bool, release: ShardyRelease = RELEASE, computations: str = COMPUTATIONS
) -> str | None:
    """The rule `release`'s registry gives the instruction `op` of an entry computation `body`."""
    module = parse_hlo(f"HloModule table\n{computations}\nENTRY %main {{{body}\n}}\n")
    comp = module.entry
    inst = comp["op"]
    shapes = [comp[o].array_shape for o in inst.operands]
    rule = sharding_rule(
        inst, shapes, inst.shape.leaves(), conservative=conservative, computation=comp, module=module, release=release
    )
    return text_of(rule)


@pytest.mark.parametrize("release", list(ShardyRelease), ids=lambda r: r.name.lower())
@pytest.mark.parametrize(("body", "expected"), [pytest.param(b, e, id=i) for i, b, e in TABLE])
def test_table(body: str, expected: str | None, release: ShardyRelease) -> None:
    assert rule_of_row(body, conservative=False, release=release) == expected


@pytest.mark.parametrize("release", list(ShardyRelease), ids=lambda r: r.name.lower())
@pytest.mark.parametrize(("body", "expected"), [pytest.param(b, e, id=i) for i, b, e in CONSERVATIVE_TABLE])
def test_conservative_table(body: str, expected: str, release: ShardyRelease) -> None:
    assert rule_of_row(body, conservative=True, release=release) == expected


def test_concatenate_without_its_computation_needs_replication() -> None:
    """Without the ops around it, a concatenate cannot tell its operands are slices: it propagates less."""
    module = parse_hlo(
        """HloModule m

ENTRY e {
  x = f32[4,8] parameter(0)
  a = f32[4,2] slice(x), slice={[0:4], [0:2]}
  b = f32[4,3] slice(x), slice={[0:4], [5:8]}
  ROOT op = f32[4,5] concatenate(a, b), dimensions={1}
}
"""
    )
    op, comp = module.entry["op"], module.entry
    shapes = [comp["a"].array_shape, comp["b"].array_shape]
    with_comp = sharding_rule(op, shapes, [op.array_shape], computation=comp, release=RELEASE)
    without = sharding_rule(op, shapes, [op.array_shape], release=RELEASE)
    assert text_of(with_comp) == f"{R}<([i, j], [i, j])->([i, j]) {{i=4, j=5}} permutation={{j}}>"
    assert text_of(without) == f"{R}<([i, j], [i, j])->([i, j]) {{i=4, j=5}} need_replication={{j}}>"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param("ROOT op = s32[8] iota(), iota_dimension=0", "nothing propagates into it", id="iota"),
        pytest.param('p = f32[8] parameter(0)\n  ROOT op = f32[8] custom-call(p), custom_call_target="tpu_custom_call"',
                     "runs opaque code", id="tpu_custom_call"),
        pytest.param('p = f32[8] parameter(0)\n  ROOT op = f32[8] custom-call(p), custom_call_target="my_kernel"',
                     "@my_kernel is unknown to Shardy", id="unknown_custom_call"),
        pytest.param("p = f32[8] parameter(0)\n  ROOT op = f32[8] copy(p)", None, id="copy_has_xlas_rule"),
        pytest.param("p = f32[8] parameter(0)\n  ROOT op = f32[8] negate(p)", None, id="negate_has_a_rule"),
    ],
)  # fmt: skip
def test_no_rule_reason(body: str, reason: str | None) -> None:
    inst = parse_hlo(f"HloModule m\n\nENTRY e {{\n  {body}\n}}\n").entry["op"]
    said = no_rule_reason(inst, RELEASE)
    assert said == reason if reason is None else reason in (said or "")

"""The rules Shardy's registry writes differently in jaxlib 0.7.1 and in jaxlib 0.12, each asked of both releases.

Every row is an entry computation whose instruction `op` is ruled on, with the rule each release gives it:
`sdy-populate-op-sharding-rules` of jaxlib 0.7.1 and of jaxlib 0.12.0.1 on the StableHLO jaxlib converts the
same HLO to (a row's comment names the Shardy change where its sources show one). The registry answers for
either release whatever jaxlib is installed, so both environments check both; the installed jaxlib only
picks the default.
"""

from __future__ import annotations

import pytest
from test_shardy_rules import rule_of_row

from planner import parse_hlo
from planner.hlo.text import jaxlib_api
from planner.propagation.shardy import release as release_module
from planner.propagation.shardy.registry import no_rule_reason, sharding_rule
from planner.propagation.shardy.release import ShardyRelease

OLD, NEW, NEWEST = ShardyRelease.JAXLIB_0_7, ShardyRelease.JAXLIB_0_12, ShardyRelease.JAXLIB_0_12_1

COMPUTATIONS = """
%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%add_and_multiply (a0: s32[], a1: f32[], w0: s32[], w1: f32[]) -> (s32[], f32[]) {
  %a0 = s32[] parameter(0)
  %a1 = f32[] parameter(1)
  %w0 = s32[] parameter(2)
  %w1 = f32[] parameter(3)
  %s = s32[] add(%a0, %w0)
  %p = f32[] multiply(%a1, %w1)
  ROOT %r = (s32[], f32[]) tuple(%s, %p)
}

%max_max (b0: s32[], b1: f32[], q0: s32[], q1: f32[]) -> (s32[], f32[]) {
  %b0 = s32[] parameter(0)
  %b1 = f32[] parameter(1)
  %q0 = s32[] parameter(2)
  %q1 = f32[] parameter(3)
  %m0 = s32[] maximum(%q0, %b0)
  %m1 = f32[] maximum(%b1, %q1)
  ROOT %r1 = (s32[], f32[]) tuple(%m0, %m1)
}

%take_update (c: f32[], d: f32[]) -> f32[] {
  %c = f32[] parameter(0)
  ROOT %d = f32[] parameter(1)
}

%or_pred (e: pred[], f: pred[]) -> pred[] {
  %e = pred[] parameter(0)
  %f = pred[] parameter(1)
  ROOT %o = pred[] or(%e, %f)
}
"""

R = "#sdy.op_sharding_rule"
SCATTER_WINDOWS = (
    "update_window_dims={2,3}, inserted_window_dims={0}, scatter_dims_to_operand_dims={1,0}, index_vector_dim=2"
)
EMBEDDING_ROWS = (
    "update_window_dims={2}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=2"
)
TWO_INPUT_SCATTER = f"""
  x = s32[3,4,2] parameter(0)
  y = f32[3,4,2] parameter(1)
  i = s64[2,3,2] parameter(2)
  u = s32[2,3,2,2] parameter(3)
  v = f32[2,3,2,2] parameter(4)
  ROOT op = (s32[3,4,2], f32[3,4,2]) scatter(x, y, i, u, v), {SCATTER_WINDOWS}"""
TWO_INPUT_SCATTER_RULE = "([n, k, m], [n, k, m], [i, j, o], [i, j, l, m], [i, j, l, m])->([n, k, m], [n, k, m]) {i=2, j=3, k=4, l=2, m=2, n=3, o=2}"

# (id, body, jaxlib 0.7.1's rule, jaxlib 0.12's rule).
TABLE = [
    # reshape: swapped pieces that share no divisor become one permutation factor; one-sided factors and
    # size-1 dims need replication.
    ("reshape_swapped_dims", """
  x = f32[6,4] parameter(0)
  ROOT op = f32[4,6] reshape(x)""",
     f"{R}<([ij, mn])->([ik, ln]) {{i=2, j=3, k=2, l=3, m=2, n=2}}>",
     f"{R}<([ij, lm])->([ij, km]) {{i=2, j=3, k=3, l=2, m=2}} need_replication={{k, l}} permutation={{j}}>"),
    ("reshape_swapped_dims_no_common_divisor", """
  x = f32[3,2] parameter(0)
  ROOT op = f32[2,3] reshape(x)""",
     f"{R}<([i, l])->([j, k]) {{i=3, j=2, k=3, l=2}}>",
     f"{R}<([i, k])->([i, j]) {{i=3, j=3, k=2}} need_replication={{j, k}} permutation={{i}}>"),
    ("reshape_size_one_dims", """
  x = f32[1,8,4] parameter(0)
  ROOT op = f32[8,1,4,1] reshape(x)""",
     f"{R}<([i, j, l])->([j, k, l, m]) {{i=1, j=8, k=1, l=4, m=1}}>",
     f"{R}<([i, j, l])->([j, k, l, m]) {{i=1, j=8, k=1, l=4, m=1}} need_replication={{i, k, m}}>"),
    # dynamic-update-slice, a scanned step's per-layer gradient: the sliced dim's two factors.
    ("dynamic_update_slice_scan_layer_grads", """
  g = f32[3,32,64] parameter(0)
  u = f32[1,32,64] parameter(1)
  l = s32[] parameter(2)
  z = s32[] constant(0)
  ROOT op = f32[3,32,64] dynamic-update-slice(g, u, l, z, z)""",
     f"{R}<([i, k, l], [j, k, l], [], [], [])->([i, k, l]) {{i=3, j=1, k=32, l=64}} need_replication={{j}}>",
     f"{R}<([i, k, l], [j, k, l], [], [], [])->([i, k, l]) {{i=3, j=1, k=32, l=64}} permutation={{i, j}}>"),
    # scatter: the input's factor of a window dim the updates cover in part (shardy@cf75920b).
    ("scatter_partial_window", f"""
  x = f32[3,4,2] parameter(0)
  i = s64[2,3,2] parameter(1)
  u = f32[2,3,2,2] parameter(2)
  ROOT op = f32[3,4,2] scatter(x, i, u), {SCATTER_WINDOWS}, to_apply=add""",
     f"{R}<([n, k, m], [i, j, o], [i, j, l, m])->([n, k, m]) {{i=2, j=3, k=4, l=2, m=2, n=3, o=2}} reduction={{i, j}} need_replication={{l, o}}>",
     f"{R}<([n, k, m], [i, j, o], [i, j, l, m])->([n, k, m]) {{i=2, j=3, k=4, l=2, m=2, n=3, o=2}} reduction={{i, j}} need_replication={{k, l, o}}>"),
    # scatter: implicit batch dims reduce only under one reduction Shardy knows (shardy@b708534e).
    ("scatter_two_inputs_add_and_multiply", f"{TWO_INPUT_SCATTER}, to_apply=add_and_multiply",
     f"{R}<{TWO_INPUT_SCATTER_RULE} reduction={{i, j}} need_replication={{l, o}}>",
     f"{R}<{TWO_INPUT_SCATTER_RULE} need_replication={{i, j, k, l, o}}>"),
    ("scatter_two_inputs_max_either_operand_order", f"{TWO_INPUT_SCATTER}, to_apply=max_max",
     f"{R}<{TWO_INPUT_SCATTER_RULE} reduction={{i, j}} need_replication={{l, o}}>",
     f"{R}<{TWO_INPUT_SCATTER_RULE} reduction={{i, j}} need_replication={{k, l, o}}>"),
    ("scatter_overwriting_embedding_rows", f"""
  e = f32[100,32] parameter(0)
  t = s32[2,16,1] parameter(1)
  u = f32[2,16,32] parameter(2)
  ROOT op = f32[100,32] scatter(e, t, u), {EMBEDDING_ROWS}, to_apply=take_update""",
     f"{R}<([l, k], [i, j, m], [i, j, k])->([l, k]) {{i=2, j=16, k=32, l=100, m=1}} reduction={{i, j}} need_replication={{m}}>",
     f"{R}<([l, k], [i, j, m], [i, j, k])->([l, k]) {{i=2, j=16, k=32, l=100, m=1}} need_replication={{i, j, m}}>"),
    ("scatter_or_of_boolean_masks", f"""
  e = pred[100,32] parameter(0)
  t = s32[2,16,1] parameter(1)
  u = pred[2,16,32] parameter(2)
  ROOT op = pred[100,32] scatter(e, t, u), {EMBEDDING_ROWS}, to_apply=or_pred""",
     f"{R}<([l, k], [i, j, m], [i, j, k])->([l, k]) {{i=2, j=16, k=32, l=100, m=1}} reduction={{i, j}} need_replication={{m}}>",
     f"{R}<([l, k], [i, j, m], [i, j, k])->([l, k]) {{i=2, j=16, k=32, l=100, m=1}} reduction={{i, j}} need_replication={{m}}>"),
    # concatenate of one array with itself, no slice among the pieces (shardy@77965a29).
    ("concatenate_array_with_itself", """
  x = f32[4,64] parameter(0)
  ROOT op = f32[12,64] concatenate(x, x, x), dimensions={0}""",
     f"{R}<([i, j], [i, j], [i, j])->([i, j]) {{i=12, j=64}} permutation={{i}}>",
     f"{R}<([i, j], [i, j], [i, j])->([i, j]) {{i=12, j=64}} need_replication={{i}}>"),
    # gather: a collapsed dim of one element (shardy@99315094).
    ("gather_size_one_collapsed_dim", """
  x = f32[1,32] parameter(0)
  i = s32[8,1] parameter(1)
  ROOT op = f32[8,32] gather(x, i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,32}""",
     f"{R}<([k, j], [i, l])->([i, j]) {{i=8, j=32, k=1, l=1}} reduction={{k}} need_replication={{l}}>",
     f"{R}<([k, j], [i, l])->([i, j]) {{i=8, j=32, k=1, l=1}} need_replication={{k, l}}>"),
    # batch-norm-inference: no entry before shardy@321f901b.
    ("batch_norm_inference", """
  x = f32[4,8,16,32] parameter(0)
  s = f32[8] parameter(1)
  o = f32[8] parameter(2)
  m = f32[8] parameter(3)
  v = f32[8] parameter(4)
  ROOT op = f32[4,8,16,32] batch-norm-inference(x, s, o, m, v), epsilon=0.001, feature_index=1""",
     None,
     f"{R}<([i, j, k, l], [j], [j], [j], [j])->([i, j, k, l]) {{i=4, j=8, k=16, l=32}}>"),
    # X64Combine seeding a rng-bit-generator (shardy@e3d919ea).
    ("custom_call_x64_combine_seeding_rng_bit_generator", """
  lo = u32[2] parameter(0)
  hi = u32[2] parameter(1)
  op = u64[2] custom-call(lo, hi), custom_call_target="X64Combine"
  ROOT r = (u64[2], u32[4,8]) rng-bit-generator(op), algorithm=rng_default""",
     f"{R}<([i], [i])->([i]) {{i=2}} blocked_propagation={{i}}>",
     f"{R}<([i], [i])->([i]) {{i=2}} need_replication={{i}} blocked_propagation={{i}}>"),
    # X64Combine alone: pointwise until jaxlib 0.12.1, which gives it no rule (NEWEST_DIFFERS).
    ("custom_call_x64_combine", """
  lo = u32[8,2] parameter(0)
  hi = u32[8,2] parameter(1)
  ROOT op = u64[8,2] custom-call(lo, hi), custom_call_target="X64Combine\"""",
     f"{R}<([i, j], [i, j])->([i, j]) {{i=8, j=2}}>",
     f"{R}<([i, j], [i, j])->([i, j]) {{i=8, j=2}}>"),
    # The SPMD partitioner's permuting calls, pointwise since shardy@826f349c.
    ("custom_call_spmd_rotate_right", """
  x = f32[8,16] parameter(0)
  ROOT op = f32[8,16] custom-call(x), custom_call_target="_SPMDInternalOp_RotateRight\"""",
     None,
     f"{R}<([i, j])->([i, j]) {{i=8, j=16}}>"),
]  # fmt: skip


# Rows whose rule jaxlib 0.12.1's Shardy writes otherwise than 0.12.0.1's (found by `make test-release`):
# the x64 emulation's custom calls have no rule there.
NEWEST_DIFFERS: dict[str, str | None] = {
    "custom_call_x64_combine": None,
    "custom_call_x64_combine_seeding_rng_bit_generator": None,
}


@pytest.mark.parametrize(
    ("body", "release", "expected"),
    [
        pytest.param(body, release, expected, id=f"{ident}-{release.name.lower()}")
        for ident, body, old, new in TABLE
        for release, expected in ((OLD, old), (NEW, new), (NEWEST, NEWEST_DIFFERS.get(ident, new)))
    ],
)
def test_rule_of_each_release(body: str, release: ShardyRelease, expected: str | None) -> None:
    assert rule_of_row(body, conservative=False, release=release, computations=COMPUTATIONS) == expected


def test_scatter_without_its_module_takes_its_update_for_a_reduction() -> None:
    """With no module to read the update computation in, a scatter's implicit batch dims are reductions, as
    for the scatter-adds JAX writes."""
    body = f"{TWO_INPUT_SCATTER}, to_apply=add_and_multiply"
    module = parse_hlo(f"HloModule m\n{COMPUTATIONS}\nENTRY %main {{{body}\n}}\n")
    op = module.entry["op"]
    shapes = [module.entry[name].array_shape for name in op.operands]
    rule = sharding_rule(op, shapes, op.shape.leaves(), release=NEW)
    assert rule is not None
    assert rule.to_text() == f"{R}<{TWO_INPUT_SCATTER_RULE} reduction={{i, j}} need_replication={{k, l, o}}>"


@pytest.mark.parametrize(
    ("body", "release", "reason"),
    [
        pytest.param("x = f32[4,8] parameter(0)\n  s = f32[8] parameter(1)\n  ROOT op = f32[4,8] batch-norm-inference(x, s, s, s, s), epsilon=0.001, feature_index=1",
                     OLD, "batch-norm-inference is unknown to openxla/shardy@5b3b2894's", id="batch_norm_before_its_entry"),
        pytest.param("x = f32[4,8] parameter(0)\n  s = f32[8] parameter(1)\n  ROOT op = f32[4,8] batch-norm-inference(x, s, s, s, s), epsilon=0.001, feature_index=1",
                     NEW, None, id="batch_norm_with_its_entry"),
        pytest.param('x = f32[8] parameter(0)\n  ROOT op = f32[8] custom-call(x), custom_call_target="_SPMDInternalOp_Wrap"',
                     OLD, "@_SPMDInternalOp_Wrap is unknown to openxla/shardy@5b3b2894's", id="spmd_wrap_before_its_entry"),
        pytest.param('x = f32[8] parameter(0)\n  ROOT op = f32[8] custom-call(x), custom_call_target="xla.debug.Log"',
                     NEW, "runs opaque code", id="debug_log_named_opaque"),
        pytest.param('x = f32[8,2] parameter(0)\n  ROOT op = f32[8,2] custom-call(x), custom_call_target="X64SplitLow"',
                     NEW, None, id="x64_split_with_its_entry"),
        pytest.param('x = f32[8,2] parameter(0)\n  ROOT op = f32[8,2] custom-call(x), custom_call_target="X64SplitLow"',
                     NEWEST, "@X64SplitLow is unknown to", id="x64_split_dropped_by_jaxlib_0_12_1"),
        pytest.param('x = f32[128,128] parameter(0)\n  ROOT op = f32[128,128] custom-call(x), custom_call_target="CompactWyHelper"',
                     NEWEST, "@CompactWyHelper is unknown to", id="compact_wy_dropped_by_jaxlib_0_12_1"),
    ],
)  # fmt: skip
def test_no_rule_reason_of_each_release(body: str, release: ShardyRelease, reason: str | None) -> None:
    inst = parse_hlo(f"HloModule m\n\nENTRY e {{\n  {body}\n}}\n").entry["op"]
    said = no_rule_reason(inst, release)
    assert said == reason if reason is None else reason in (said or "")


@pytest.mark.parametrize(
    ("version", "release"),
    [
        pytest.param((0, 7, 1), OLD, id="jaxlib_0_7_1"),
        pytest.param((0, 12, 0), NEW, id="jaxlib_0_12"),
        pytest.param((0, 12, 0, 1), NEW, id="jaxlib_0_12_0_1"),
        pytest.param((0, 12, 1), NEWEST, id="jaxlib_0_12_1"),
        pytest.param((0, 9, 0), OLD, id="between_takes_the_older"),
        pytest.param((0, 4, 30), OLD, id="older_than_all_takes_the_oldest"),
        pytest.param((1, 0), NEWEST, id="newer_than_all_takes_the_newest"),
    ],
)
def test_release_of_a_jaxlib(version: tuple[int, ...], release: ShardyRelease) -> None:
    assert ShardyRelease.for_jaxlib(version) is release


def test_the_newest_release_is_the_default_without_jaxlib(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_jaxlib() -> tuple[int, ...]:
        raise ImportError("No module named 'jaxlib'")

    monkeypatch.setattr(jaxlib_api, "jaxlib_version", no_jaxlib)
    release_module._installed.cache_clear()
    try:
        assert ShardyRelease.installed() is ShardyRelease.newest() is NEWEST
    finally:
        release_module._installed.cache_clear()


def test_a_rule_asked_of_no_release_is_the_installed_jaxlibs() -> None:
    """A reshape dropping a size-1 dim, whose rule tells the releases apart."""
    body = "x = f32[1,8] parameter(0)\n  ROOT op = f32[8] reshape(x)"
    by_release = {release: rule_of_row(body, conservative=False, release=release) for release in ShardyRelease}
    assert by_release[OLD] != by_release[NEW]
    assert _default_rule(body) == by_release[ShardyRelease.installed()]


def _default_rule(body: str) -> str | None:
    module = parse_hlo(f"HloModule m\n\nENTRY e {{\n  {body}\n}}\n")
    op = module.entry["op"]
    rule = sharding_rule(op, [module.entry[name].array_shape for name in op.operands], op.shape.leaves())
    return rule.to_text() if rule is not None else None

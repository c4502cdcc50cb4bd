"""Shardy's import passes on small programs, each against what the pass's own source says it does."""

from __future__ import annotations

from planner.hlo.ir.shapes import ArrayShape
from planner.propagation.shardy.apply_sharding_constraints import apply_sharding_constraints
from planner.propagation.shardy.program import Program
from planner.propagation.shardy.sharding_group_import import unify_sharding_groups


def test_groups_sharing_a_value_become_one_numbered_by_their_leaders() -> None:
    program = Program({})
    x, y, z, w, v = (program.new_value(name, ArrayShape("f32", (8,))) for name in "xyzwv")
    program.groups = {3: [x, y], 5: [w], 7: [y, z, y], 9: [v, z]}
    unify_sharding_groups(program)
    assert {gid: [m.name for m in members] for gid, members in program.groups.items()} == {
        0: ["x", "y", "z", "v"],
        1: ["w"],
    }


def test_groups_sharing_nothing_are_renumbered_in_order() -> None:
    program = Program({})
    x, y = (program.new_value(name, ArrayShape("f32", (8,))) for name in "xy")
    program.groups = {4: [y], 2: [x]}
    unify_sharding_groups(program)
    assert {gid: [m.name for m in members] for gid, members in program.groups.items()} == {0: ["x"], 1: ["y"]}


_LOOP = """HloModule loop, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["a"=2, "b"=2]>}}

cond {
  p = (s32[], f32[8,8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(4)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], f32[8,8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[8,8] get-tuple-element(p), index=1
  c = f32[8,8] custom-call(x), custom_call_target="Sharding", frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{\\"a\\"}, {}]>]>"}
  y = f32[8,8] add(x, x)
  one = s32[] constant(1)
  j = s32[] add(i, one)
  ROOT t = (s32[], f32[8,8]) tuple(j, y)
}

ENTRY main {
  x0 = f32[8,8] parameter(0)
  z = s32[] constant(0)
  init = (s32[], f32[8,8]) tuple(z, x0)
  w = (s32[], f32[8,8]) while(init), condition=cond, body=body
  r = f32[8,8] get-tuple-element(w), index=1
  s = f32[8,8] custom-call(r), custom_call_target="Sharding", frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{}, {\\"b\\"}]>]>"}
  ROOT out = f32[8,8] negate(r)
}
"""


def _loop_program() -> Program:
    from planner import parse_hlo
    from planner.hlo.text.shardy_import import module_meshes
    from planner.propagation.shardy.program import build_program

    module = parse_hlo(_LOOP)
    return build_program(module, module_meshes(module), keep_dead=True)


def test_a_constraint_on_a_loop_carried_value_is_read_through_not_applied() -> None:
    """The carried value owns its loop's edge: inside the body its readers read the constraint instead
    (`replaceAllUsesExcept`), outside the loop the result's readers read the other constraint, and
    the owner itself takes neither sharding."""
    program = _loop_program()
    apply_sharding_constraints(program)
    owner = next(v for v in program.values if v.name == "w.1")
    assert owner.sharding is None
    body_add = next(op for op in program.ops if op.inst is not None and op.inst.name == "y")
    assert [v.name for v in body_add.operands] == ["c", "c"]
    negate = next(op for op in program.ops if op.inst is not None and op.inst.name == "out")
    assert [v.name for v in negate.operands] == ["s"]


def test_a_constraint_on_an_ordinary_value_is_applied_to_it() -> None:
    program = Program({})
    from planner import parse_hlo
    from planner.hlo.text.shardy_import import module_meshes
    from planner.propagation.shardy.program import build_program

    module = parse_hlo(
        'HloModule m, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["a"=2]>}}\n\n'
        "ENTRY main {\n  x = f32[8] parameter(0)\n  y = f32[8] negate(x)\n"
        '  ROOT c = f32[8] custom-call(y), custom_call_target="Sharding", '
        'frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{\\"a\\"}]>]>"}\n}\n'
    )
    program = build_program(module, module_meshes(module))
    apply_sharding_constraints(program)
    negated = next(v for v in program.values if v.name == "y")
    assert negated.sharding is not None and negated.sharding.to_text() == '<@mesh, [{"a"}]>'


def test_the_main_functions_unsharded_results_take_the_returned_sharding_from_jaxlib_0_12_on() -> None:
    """`sdy-propagate-to-func-results`, as jaxlib 0.12.0.1's own pass runs on a bare module: a main result with
    no sharding takes its returned value's, one with a sharding keeps it; jaxlib 0.7.1 writes neither."""
    from planner.propagation.shardy.program import FuncResult
    from planner.propagation.shardy.propagate_to_func_results import propagate_to_func_results
    from planner.propagation.shardy.release import ShardyRelease
    from planner.sharding.shardy import AxisRef, DimSharding, TensorSharding

    replicated = TensorSharding("mesh", (DimSharding(()), DimSharding(())))
    pinned = TensorSharding("mesh", (DimSharding((AxisRef("a"),)), DimSharding(())))
    got = {}
    for release in (ShardyRelease.JAXLIB_0_7, ShardyRelease.JAXLIB_0_12, ShardyRelease.JAXLIB_0_12_1):
        program = Program({}, release)
        x, y = (program.new_value(name, ArrayShape("f32", (8, 8))) for name in "xy")
        x.sharding = y.sharding = replicated
        program.results = [FuncResult(x, None), FuncResult(y, pinned)]
        propagate_to_func_results(program)
        got[release] = [r.sharding for r in program.results]
    assert got[ShardyRelease.JAXLIB_0_7] == [None, pinned]
    assert got[ShardyRelease.JAXLIB_0_12] == got[ShardyRelease.JAXLIB_0_12_1] == [replicated, pinned]

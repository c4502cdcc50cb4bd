"""XLA:TPU's pre-partitioning passes, one at a time, on small modules whose outcome XLA's source fixes.

Each case is the smallest module that shows one rule of the pass it exercises (the docstrings cite
the rule); the passes together are checked against XLA:TPU's own module in
`tests/test_prepare_tpu.py`.
"""

from __future__ import annotations

import pytest

from planner import parse_hlo
from planner.hlo.ir.module import HloModule
from planner.hlo.structure.loops import while_loops
from planner.prepare import prepare
from planner.prepare.algebraic_simplifier import AlgebraicSimplifier
from planner.prepare.constant_sinking import WhileLoopConstantSinking
from planner.prepare.constant_splitter import HloConstantSplitter
from planner.prepare.cse import HloCse
from planner.prepare.loop_invariant_motion import WhileLoopInvariantCodeMotion
from planner.prepare.module_dce import HloModuleDce
from planner.prepare.sparse_gradient import SparseGradientRewrite
from planner.prepare.while_simplifier import WhileLoopSimplifier

# A scan of 4 trips: element 1 is the carry, element 2 a carried constant the body reads (a mask
# fill), element 3 passes through unread, element 4 is element 2's twin (the same init value).
LOOP = """HloModule m, num_partitions=2

body {
  p = (s32[], f32[8,16], f32[8,16], f32[8,16], f32[8,16]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  next = s32[] add(i, one)
  x = f32[8,16] get-tuple-element(p), index=1
  fill = f32[8,16] get-tuple-element(p), index=2
  y = f32[8,16] add(x, fill)
  idle = f32[8,16] get-tuple-element(p), index=3
  twin = f32[8,16] get-tuple-element(p), index=4
  ROOT t = (s32[], f32[8,16], f32[8,16], f32[8,16], f32[8,16]) tuple(next, y, fill, idle, twin)
}

cond {
  p = (s32[], f32[8,16], f32[8,16], f32[8,16], f32[8,16]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(4)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY e {
  a = f32[8,16] parameter(0), sharding={devices=[2,1]<=[2]}
  b = f32[8,16] parameter(1), sharding={devices=[1,2]<=[2]}
  zero = s32[] constant(0)
  c = f32[] constant(-1e9)
  fill = f32[8,16] broadcast(c), dimensions={}
  init = (s32[], f32[8,16], f32[8,16], f32[8,16], f32[8,16]) tuple(zero, a, fill, b, fill)
  w = (s32[], f32[8,16], f32[8,16], f32[8,16], f32[8,16]) while(init), condition=cond, body=body
  r = f32[8,16] get-tuple-element(w), index=1
  s = f32[8,16] get-tuple-element(w), index=3
  ROOT out = (f32[8,16], f32[8,16]) tuple(r, s)
}
"""


def _loop(module: HloModule):
    (loop,) = while_loops(module)
    return loop


def _elements(module: HloModule) -> list[str]:
    return [leaf.to_text(False) for leaf in _loop(module).instruction.shape.leaves()]


def test_constant_sinking_sinks_a_carried_broadcast_of_a_constant_and_keeps_the_element() -> None:
    """while_loop_constant_sinking.cc: readers of a pass-through element whose init is a constant (or, with
    sink_broadcast_of_constants, a broadcast of one) read a copy made in the body; the root keeps passing it."""
    module = parse_hlo(LOOP)
    off = WhileLoopConstantSinking(sink_broadcast_of_constants=False).run(module)
    assert not off.changed
    sunk = WhileLoopConstantSinking(sink_broadcast_of_constants=True).run(module).module
    body = sunk.computation("body")
    y = body["y"]
    copy = body[y.operands[1]]
    assert copy.opcode == "broadcast" and body[copy.operands[0]].opcode == "constant"
    assert body.root.operands[2] == "fill"  # still carried, now read by nothing but the root
    assert len(_elements(sunk)) == 5


def test_scalar_only_sinking_leaves_arrays() -> None:
    module = parse_hlo(LOOP)
    assert not WhileLoopConstantSinking(True, sink_only_scalar_constants=True).run(module).changed


def test_simplifier_carries_a_repeated_element_once() -> None:
    """TryRemoveRepeatedWhileTupleIndices: elements 2 and 4 are passed through and start from the same
    instruction, so element 4 goes and its reads read element 2."""
    out = WhileLoopSimplifier().run(parse_hlo(LOOP)).module
    assert _elements(out) == ["s32[]", "f32[8,16]", "f32[8,16]", "f32[8,16]"]
    body = out.computation("body")
    assert [body[o].attr("index") for o in body.root.operands[1:] if body[o].opcode == "get-tuple-element"] == [2, 3]


def test_simplifier_removes_elements_nothing_reads_once_sunk() -> None:
    """TryRemoveDeadWhileParams: after sinking, element 2 (and its twin) only pass through and nothing after the
    loop reads them; element 3 passes through and is read after the loop, which reads its initial value."""
    module = parse_hlo(LOOP)
    for p in (WhileLoopConstantSinking(True), WhileLoopSimplifier(), WhileLoopSimplifier(), WhileLoopSimplifier()):
        module = p.run(module).module
    assert _elements(module) == ["s32[]", "f32[8,16]"]
    entry = module.entry
    assert entry.root.operands[1] == "b"  # the pass-through element's value after the loop is its init


def test_module_dce_passes_dead_updates_through() -> None:
    """hlo_module_dce.cc: an element nothing after the loop and nothing live in the body reads is made
    pass-through; the simplifier it runs then makes one rewrite of the loop (the repeated element), the
    next run removes the dead one."""
    text = LOOP.replace("ROOT out = (f32[8,16], f32[8,16]) tuple(r, s)", "ROOT out = (f32[8,16]) tuple(r)")
    text = text.replace(
        "idle = f32[8,16] get-tuple-element(p), index=3",
        "idle0 = f32[8,16] get-tuple-element(p), index=3\n  idle = f32[8,16] negate(idle0)",
    )
    out = HloModuleDce().run(parse_hlo(text)).module
    assert len(_elements(out)) == 4  # the twin of the fill is gone
    assert all(i.opcode != "negate" for i in out.computation("body"))
    assert _elements(WhileLoopSimplifier().run(out).module) == ["s32[]", "f32[8,16]", "f32[8,16]"]


INVARIANT = """HloModule m, num_partitions=2

body {
  p = (s32[], f32[8,16], f32[16]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  next = s32[] add(i, one)
  x = f32[8,16] get-tuple-element(p), index=1
  v = f32[16] get-tuple-element(p), index=2
  e = f32[16] exponential(v)
  wide = f32[8,16] broadcast(e), dimensions={1}
  k = s32[8,16] iota(), iota_dimension=0
  kf = f32[8,16] convert(k)
  y = f32[8,16] add(x, wide)
  z = f32[8,16] add(y, kf)
  ROOT t = (s32[], f32[8,16], f32[16]) tuple(next, z, v)
}

cond {
  p = (s32[], f32[8,16], f32[16]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(4)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY e {
  a = f32[8,16] parameter(0)
  v = f32[16] parameter(1)
  zero = s32[] constant(0)
  init = (s32[], f32[8,16], f32[16]) tuple(zero, a, v)
  w = (s32[], f32[8,16], f32[16]) while(init), condition=cond, body=body
  ROOT r = f32[8,16] get-tuple-element(w), index=1
}
"""


def test_invariant_motion_hoists_what_does_not_grow_and_leaves_iotas() -> None:
    """while_loop_invariant_code_motion.cc with XLA:TPU's size-inflation limit: exp(v) is invariant and as large as v,
    so it is hoisted and carried; broadcasts only follow what they broadcast; an iota (no operands) always inflates,
    so it and what is computed from it stay in the body."""
    out = WhileLoopInvariantCodeMotion().run(parse_hlo(INVARIANT)).module
    assert _elements(out) == ["s32[]", "f32[8,16]", "f32[16]", "f32[16]"]
    entry_ops = {i.opcode for i in out.entry}
    assert "exponential" in entry_ops and "iota" not in entry_ops
    body_ops = {i.opcode for i in out.computation("body")}
    assert "exponential" not in body_ops and {"iota", "convert"} <= body_ops
    unlimited = WhileLoopInvariantCodeMotion(hoist_size_inflation_ratio=None).run(parse_hlo(INVARIANT)).module
    assert "convert" in {i.opcode for i in unlimited.entry}  # XLA's default options hoist it too


CSE = """HloModule m

ENTRY e {
  a = f32[8] parameter(0)
  b = f32[8] parameter(1)
  x = f32[8] add(a, b)
  y = f32[8] add(b, a)
  u = f32[8] multiply(x, x), sharding={replicated}
  v = f32[8] multiply(y, y), sharding={devices=[2]<=[2]}
  c1 = f32[] constant(2)
  c2 = f32[] constant(2)
  ROOT t = (f32[8], f32[8], f32[], f32[]) tuple(u, v, c1, c2)
}
"""


def test_cse_merges_commutative_twins_and_equal_constants_but_not_different_shardings() -> None:
    """hlo_cse.cc: add(a, b) and add(b, a) are one value; equal constants are one; identity is sharding-sensitive."""
    rewrite = HloCse().run(parse_hlo(CSE))
    entry = rewrite.module.entry
    assert rewrite.renamed == {"c2": "c1", "y": "x"}
    assert entry.root.operands == ("u", "v", "c1", "c1")
    assert entry["v"].operands == ("x", "x")


def test_constant_splitter_copies_an_expression_for_each_reader_without_its_sharding() -> None:
    """hlo_constant_splitter.cc with split_expressions (and the newer clear_sharding): an iota expression read
    by two instructions that are not constant expressions themselves becomes two."""
    text = """HloModule m

ENTRY e {
  i = s32[8,8] iota(), iota_dimension=0
  j = s32[8,8] iota(), iota_dimension=1
  mask = pred[8,8] compare(i, j), direction=GE, sharding={devices=[2,1]<=[2]}
  a = pred[8,8] transpose(mask), dimensions={1,0}
  b = pred[8,8] reverse(mask), dimensions={0}
  ROOT t = (pred[8,8], pred[8,8]) tuple(a, b)
}
"""
    out = HloConstantSplitter().run(parse_hlo(text)).module.entry
    masks = [i for i in out if i.opcode == "compare"]
    assert len({out[o].name for o in out["a"].operands} | {out[o].name for o in out["b"].operands}) == 2
    assert all(m.sharding is None for m in masks if m.name != "mask")


def test_sparse_gradient_rewrite_turns_the_cross_entropy_scatter_into_a_select() -> None:
    text = """HloModule m

add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT s = f32[] add(x, y)
}

ENTRY e {
  zero = f32[] constant(0)
  base = f32[4,6,10] broadcast(zero), dimensions={}
  labels = s32[4,6,1] parameter(0)
  g = f32[4,6,1] parameter(1)
  ROOT s = f32[4,6,10] scatter(base, labels, g), update_window_dims={}, inserted_window_dims={2}, scatter_dims_to_operand_dims={2}, input_batching_dims={0,1}, scatter_indices_batching_dims={0,1}, index_vector_dim=2, to_apply=add
}
"""
    rewrite = SparseGradientRewrite().run(parse_hlo(text))
    entry = rewrite.module.entry
    # The entry's `s` reads `s.1`: the add computation holds an `s` too (XLA's parser renames it so).
    assert entry.root.opcode == "select" and rewrite.renamed == {"s.1": entry.root.name}
    hit = entry[entry.root.operands[0]]
    assert hit.opcode == "compare" and {entry[o].opcode for o in hit.operands} == {"broadcast", "iota"}
    assert all(i.opcode != "scatter" for i in entry)


def test_algebraic_simplifier_writes_a_size_one_broadcast_as_a_reshape() -> None:
    """algebraic_simplifier.cc HandleBroadcast: a broadcast inserting size-1 dims in order is a reshape."""
    text = """HloModule m

ENTRY e {
  g = f32[16,32] parameter(0)
  one = f32[1,16,32] broadcast(g), dimensions={1,2}
  same = f32[1,16,32] broadcast(one), dimensions={0,1,2}
  ROOT n = f32[1,16,32] negate(same)
}
"""
    entry = AlgebraicSimplifier().run(parse_hlo(text)).module.entry
    assert entry["one"].opcode == "reshape" and entry.root.operands == ("one",)


def test_disabled_passes_do_not_run_as_with_xla_disable_hlo_passes() -> None:
    module = parse_hlo(LOOP)
    on = prepare(module, "v6e")
    off = prepare(module, "v6e", disabled=frozenset({"while-loop-constant-sinking", "simplify-while-loops",
                                                     "hlo-module-dce", "cse"}))  # fmt: skip
    assert len(_elements(on.module)) == 2
    assert len(_elements(off.module)) == 5 and "while-loop-constant-sinking" not in {r.name for r in off.passes}


@pytest.mark.parametrize("target", ["cpu", "h100"])
def test_compilers_without_a_modelled_pipeline_see_the_front_alone(target: str) -> None:
    prepared = prepare(parse_hlo(LOOP), target)
    assert prepared.module == prepared.front


_REPEATED_ELEMENTS = """HloModule m

cond {
  v = (s32[], s32[], s32[]) parameter(0)
  c = s32[] get-tuple-element(v), index=0
  limit = s32[] constant(10)
  ROOT lt = pred[] compare(c, limit), direction=LT
}

body {
  p = (s32[], s32[], s32[]) parameter(0)
  c = s32[] get-tuple-element(p), index=0
  l = s32[] get-tuple-element(p), index=1
  r = s32[] get-tuple-element(p), index=2
  a = s32[] add(l, r)
  ROOT t = (s32[], s32[], s32[]) tuple(c, l, a)
}

ENTRY e {
  zero = s32[] constant(0)
  p0 = s32[] parameter(0)
  init = (s32[], s32[], s32[]) tuple(zero, zero, p0)
  while = (s32[], s32[], s32[]) while(init), body=body, condition=cond
  ROOT out = (s32[], s32[], s32[]) copy(while)
}
"""


@pytest.mark.parametrize("reader", ["copy", "root"])
def test_a_loop_read_whole_after_its_elements_are_simplified_keeps_its_result(reader: str) -> None:
    """Elements 0 and 1 start equal and pass through: XLA:TPU's simplifier carries one. What reads the loop's
    whole result (a copy, or the computation's root) reads a tuple rebuilt in the old shape, as XLA's does."""
    text = _REPEATED_ELEMENTS
    if reader == "root":
        text = text.replace("  ROOT out = (s32[], s32[], s32[]) copy(while)\n", "").replace(
            "  while =", "  ROOT while ="
        )
    module = parse_hlo(text)
    prepared = prepare(module, "v6e")
    entry = prepared.module.entry
    (loop,) = [i for i in entry if i.opcode == "while"]
    assert len(loop.shape.elements) < 3  # simplified
    assert entry.root.shape == module.entry.root.shape  # the step's result is the same
    whole = entry[entry.root.operands[0]] if reader == "copy" else entry.root
    assert whole.opcode == "tuple" and len(whole.operands) == 3

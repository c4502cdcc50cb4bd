"""One computation per sequential call site (XLA's FlattenCallGraph), and constants whose data a dump elides.

JAX writes one callee for every place a jitted function is called (MaxText's mixture-of-experts steps call
`searchsorted`, a While inside, from several places); the loop passes after inlining rewrite a body for its
own loop, which needs each While to have a body of its own.
"""

from __future__ import annotations

from planner.hlo.structure.flatten import flatten_call_graph
from planner.hlo.text.parser import parse_hlo
from planner.prepare import prepare
from planner.prepare.cse import HloCse

TWO_CALLS = """HloModule two_calls, num_partitions=2

cond {
  p = (s32[], f32[4], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], f32[4], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  next = s32[] add(i, one)
  x = f32[4] get-tuple-element(p), index=1
  k = f32[4] get-tuple-element(p), index=2
  y = f32[4] add(x, k)
  ROOT t = (s32[], f32[4], f32[4]) tuple(next, y, k)
}

loop_fn {
  a = f32[4] parameter(0)
  zero = s32[] constant(0)
  c = f32[4] constant({1, 2, 3, 4})
  init = (s32[], f32[4], f32[4]) tuple(zero, a, c)
  w = (s32[], f32[4], f32[4]) while(init), condition=cond, body=body
  ROOT r = f32[4] get-tuple-element(w), index=1
}

ENTRY main {
  x = f32[4] parameter(0), sharding={devices=[2]0,1}
  first = f32[4] call(x), to_apply=loop_fn
  second = f32[4] call(first), to_apply=loop_fn
  ROOT out = (f32[4], f32[4]) tuple(first, second)
}
"""


def _bodies(module) -> list[str]:  # type: ignore[no-untyped-def]
    return [i.attr("body").names[0] for c in module.computations for i in c if i.opcode == "while"]


def test_a_callee_called_twice_gets_a_copy_and_so_does_the_while_body_inside_it() -> None:
    module = parse_hlo(TWO_CALLS)
    flat = flatten_call_graph(module)
    names = [c.name for c in flat.computations]
    assert names.count("loop_fn") == 1 and "loop_fn.clone" in names
    assert {"body", "body.clone", "cond", "cond.clone"} <= set(names)
    # Instruction names stay unique in the module, as HLO text requires.
    everything = [i.name for c in flat.computations for i in c]
    assert len(everything) == len(set(everything))
    assert flatten_call_graph(flat) is flat  # nothing left to copy


def test_each_inlined_loop_has_its_own_body_after_preparing() -> None:
    prepared = prepare(parse_hlo(TWO_CALLS), "cpu")
    bodies = _bodies(prepared.module)
    assert len(bodies) == 2 and len(set(bodies)) == 2, bodies
    assert any(r.name == "flatten-call-graph" and r.summary for r in prepared.passes)


ELIDED = """HloModule elided

ENTRY main {
  a = s8[1,4,4]{2,1,0} constant({...})
  b = s8[1,4,4]{2,1,0} constant({...})
  c = f32[2]{0} constant({1, 2})
  d = f32[2]{0} constant({1, 2})
  ROOT t = (s8[1,4,4], s8[1,4,4], f32[2], f32[2]) tuple(a, b, c, d)
}
"""


def test_constants_whose_data_the_dump_elides_are_never_merged() -> None:
    rewrite = HloCse().run(parse_hlo(ELIDED))
    root = rewrite.module.entry.root
    assert root.operands[0] != root.operands[1]  # two unknown tables stay two
    assert root.operands[2] == root.operands[3]  # equal literals merge

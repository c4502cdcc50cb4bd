"""shardy-xla's round trip of While loops (`planner.prepare.shardy_round_trip`), rule by rule, then against XLA.

Each small module pins one part of the rule (its id says which; the pass's docstring says where the
rule comes from) by the element shapes of its loops after the pass, in order. `RULES` is a
hand-written module XLA itself compiled (8 CPU devices, Shardy): its expected shapes are XLA's after
`shardy-xla`. The JAX steps compare with XLA's own dumps (`tests/data/shardy_round_trip.json`) on
the inputs the reference cache holds: XLA:TPU's module entering propagation, and for XLA:CPU the
step as JAX lowered it through the planner's front passes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from fidelity.references import cache_dir
from planner import parse_hlo, parse_hlo_file
from planner.errors import UnsupportedHlo
from planner.hlo.ir.module import HloModule
from planner.hlo.ir.shapes import TupleShape
from planner.hlo.text.printer import print_module
from planner.prepare.front import CallInlining
from planner.prepare.shardy_round_trip import ShardyRoundTrip

FIXTURE = Path(__file__).parent / "data" / "shardy_round_trip.json"


def loops(module: HloModule) -> list[tuple[str, list[str]]]:
    """Each While's element shapes, in entry program order, a nested loop after the loop holding it."""
    found: list[tuple[str, list[str]]] = []

    def visit(name: str) -> None:
        for inst in module.computation(name):
            if inst.opcode == "while":
                assert isinstance(inst.shape, TupleShape)
                found.append((inst.name, [e.to_text(False) for e in inst.shape.elements]))
                visit(inst.attr("condition").names[0])
                visit(inst.attr("body").names[0])

    visit(module.entry_name)
    return found


def check_valid(module: HloModule) -> None:
    """The rewritten module parses back, and each While's init, parameters and body root share its shape."""
    parse_hlo(print_module(module))
    for comp in module.computations:
        for inst in comp:
            if inst.opcode != "while":
                continue
            body = module.computation(inst.attr("body").names[0])
            cond = module.computation(inst.attr("condition").names[0])
            want = inst.shape.to_text(False)
            for shape in (comp[inst.operands[0]].shape, body.parameters[0].shape, cond.parameters[0].shape,
                          body.root.shape):  # fmt: skip
                assert shape.to_text(False) == want, f"{inst.name}: {shape.to_text(False)} != {want}"


def round_trip(text: str, **options: bool) -> HloModule:
    module = ShardyRoundTrip(**options).run(parse_hlo(text)).module
    check_valid(module)
    return module


def scan(elements: str, body: str, init: str, cond_reads: str = "", entry: str = "", result: int = 1) -> str:
    """A loop of `elements` (after the counter) counting to 4 from `init`: `body` computes `next` and
    the root `t` from `i` and the parameter `p`; the entry returns element `result` (an f32[8])."""
    shape = f"(s32[], {elements})"
    return f"""HloModule m, num_partitions=8

body {{
  p = {shape} parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  next = s32[] add(i, one)
{body}
}}

cond {{
  p = {shape} parameter(0)
  i = s32[] get-tuple-element(p), index=0
{cond_reads or "  n = s32[] constant(4)"}
  ROOT lt = pred[] compare(i, n), direction=LT
}}

ENTRY e {{
  x = f32[8] parameter(0)
  w = f32[8,8] parameter(1)
  s = f32[] parameter(2)
  v = f32[8] parameter(3)
  k = s32[] parameter(4)
  zero = s32[] constant(0)
{entry}
  init = {shape} tuple(zero, {init})
  loop = {shape} while(init), condition=cond, body=body
  ROOT r = f32[8] get-tuple-element(loop), index={result}
}}
"""


# (id, module, loops after the pass). Element 0 is always the counter; `x` the carry the body updates.
RULE_CASES = [
    (
        # WhileOpImplicitCapture: the weight the body returns at its own index is dropped and appended
        # after the carries as a capture.
        "pass_through_is_captured_after_the_carries",
        scan(
            "f32[8,8], f32[8]",
            """  wt = f32[8,8] get-tuple-element(p), index=1
  x = f32[8] get-tuple-element(p), index=2
  y = f32[8] dot(wt, x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = (s32[], f32[8,8], f32[8]) tuple(next, wt, y)""",
            "w, x",
            result=2,
        ),
        [["s32[]", "f32[8]", "f32[8,8]"]],
    ),
    (
        # Only dropped elements that something reads are captured.
        "unread_pass_through_is_gone",
        scan(
            "f32[8], f32[8,8]",
            """  x = f32[8] get-tuple-element(p), index=1
  y = f32[8] negate(x)
  u = f32[8,8] get-tuple-element(p), index=2
  ROOT t = (s32[], f32[8], f32[8,8]) tuple(next, y, u)""",
            "x, w",
        ),
        [["s32[]", "f32[8]"]],
    ),
    (
        # Elements returned at each other's position (a swap) are no pass-through: nothing changes.
        "elements_returned_at_another_position_stay",
        scan(
            "f32[8], f32[8], f32[8]",
            """  x = f32[8] get-tuple-element(p), index=1
  a = f32[8] get-tuple-element(p), index=2
  b = f32[8] get-tuple-element(p), index=3
  y = f32[8] add(x, b)
  ROOT t = (s32[], f32[8], f32[8], f32[8]) tuple(next, y, b, a)""",
            "x, v, x",
        ),
        [["s32[]", "f32[8]", "f32[8]", "f32[8]"]],
    ),
    (
        # `a` passes through and goes; `b`, returned `a`'s value from another start, stays, and the
        # value it returns (`a`'s start, `vr`) becomes a capture the body returns: one out, one in.
        "kept_element_returning_a_dropped_one_captures_its_value",
        scan(
            "f32[8], f32[1,8], f32[1,8]",
            """  x = f32[8] get-tuple-element(p), index=1
  a = f32[1,8] get-tuple-element(p), index=2
  b = f32[1,8] get-tuple-element(p), index=3
  br = f32[8] reshape(b)
  y = f32[8] add(x, br)
  ROOT t = (s32[], f32[8], f32[1,8], f32[1,8]) tuple(next, y, a, a)""",
            "x, vr, xr",
            entry="  vr = f32[1,8] reshape(v)\n  xr = f32[1,8] reshape(x)",
        ),
        [["s32[]", "f32[8]", "f32[1,8]", "f32[1,8]"]],
    ),
    (
        # The fixed point: element 3 returns element 2's argument and starts from the same `v`; once
        # element 2 is dropped the body returns `v` itself at 3, so 3 goes too. `v` is captured once.
        "twin_of_a_dropped_element_goes_next_round",
        scan(
            "f32[8], f32[8], f32[8]",
            """  x = f32[8] get-tuple-element(p), index=1
  a = f32[8] get-tuple-element(p), index=2
  b = f32[8] get-tuple-element(p), index=3
  ab = f32[8] add(a, b)
  y = f32[8] add(x, ab)
  ROOT t = (s32[], f32[8], f32[8], f32[8]) tuple(next, y, a, a)""",
            "x, v, v",
        ),
        [["s32[]", "f32[8]", "f32[8]"]],
    ),
    (
        # A captured constant is copied into the body, not carried.
        "captured_constant_is_copied_in",
        scan(
            "f32[8], f32[]",
            """  x = f32[8] get-tuple-element(p), index=1
  c = f32[] get-tuple-element(p), index=2
  cb = f32[8] broadcast(c), dimensions={}
  y = f32[8] multiply(x, cb)
  ROOT t = (s32[], f32[8], f32[]) tuple(next, y, c)""",
            "x, two",
            entry="  two = f32[] constant(2)",
        ),
        [["s32[]", "f32[8]"]],
    ),
    (
        # A value that is no constant expression is one capture however many ops read it.
        "scalar_read_twice_is_one_capture",
        scan(
            "f32[8], f32[]",
            """  x = f32[8] get-tuple-element(p), index=1
  c = f32[] get-tuple-element(p), index=2
  c2 = f32[] multiply(c, c)
  cb = f32[8] broadcast(c2), dimensions={}
  y = f32[8] add(x, cb)
  ROOT t = (s32[], f32[8], f32[]) tuple(next, y, c)""",
            "x, s",
        ),
        [["s32[]", "f32[8]", "f32[]"]],
    ),
    (
        # ConstantOrScalarSplitter: each op reading a constant expression (an iota) reads its own copy.
        "constant_expression_is_one_capture_per_reader",
        scan(
            "f32[8], f32[8]",
            """  x = f32[8] get-tuple-element(p), index=1
  io = f32[8] get-tuple-element(p), index=2
  y0 = f32[8] add(x, io)
  y = f32[8] multiply(y0, io)
  ROOT t = (s32[], f32[8], f32[8]) tuple(next, y, io)""",
            "x, iota",
            entry="  iota = f32[8] iota(), iota_dimension=0",
        ),
        [["s32[]", "f32[8]", "f32[8]", "f32[8]"]],
    ),
    (
        # The RoPE table on XLA:TPU: the body reshapes the table once (a constant expression too) and
        # two ops read the reshape; each gets a copy of the reshape and of the table outside.
        "reshape_of_a_constant_read_twice_is_two_captures",
        scan(
            "f32[8], f32[1,8]",
            """  x = f32[8] get-tuple-element(p), index=1
  tbl = f32[1,8] get-tuple-element(p), index=2
  row = f32[8] reshape(tbl)
  y0 = f32[8] add(x, row)
  y = f32[8] multiply(y0, row)
  ROOT t = (s32[], f32[8], f32[1,8]) tuple(next, y, tbl)""",
            "x, table",
            entry="  iota = f32[8] iota(), iota_dimension=0\n  table = f32[1,8] reshape(iota)",
        ),
        [["s32[]", "f32[8]", "f32[1,8]", "f32[1,8]"]],
    ),
    (
        # The condition is walked before the body: its capture comes first, whatever the indices.
        "condition_reads_are_captured_first",
        scan(
            "f32[8], f32[8,8], s32[]",
            """  x = f32[8] get-tuple-element(p), index=1
  wt = f32[8,8] get-tuple-element(p), index=2
  y = f32[8] dot(wt, x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  n = s32[] get-tuple-element(p), index=3
  ROOT t = (s32[], f32[8], f32[8,8], s32[]) tuple(next, y, wt, n)""",
            "x, w, k",
            cond_reads="  n = s32[] get-tuple-element(p), index=3",
        ),
        [["s32[]", "f32[8]", "s32[]", "f32[8,8]"]],
    ),
    (
        # Captures follow the importer's order (MakeInstructionPostOrder from the root, operand 0
        # first), not the text's: `ya` reads `a` first although `yb` is written first.
        "captures_follow_post_order_not_text_order",
        scan(
            "f32[8], f32[8], f32[1,8]",
            """  x = f32[8] get-tuple-element(p), index=1
  a = f32[8] get-tuple-element(p), index=2
  b = f32[1,8] get-tuple-element(p), index=3
  br = f32[8] reshape(b)
  yb = f32[8] multiply(x, br)
  ya = f32[8] multiply(x, a)
  y = f32[8] add(ya, yb)
  ROOT t = (s32[], f32[8], f32[8], f32[1,8]) tuple(next, y, a, b)""",
            "x, v, vr",
            entry="  vr = f32[1,8] reshape(v)",
        ),
        [["s32[]", "f32[8]", "f32[8]", "f32[1,8]"]],
    ),
]
RULE = {name: text for name, text, _ in RULE_CASES}

# A loop inside a loop: the inner loop starts its carry from the outer's pass-through `b` and reads
# the outer's pass-through `a`. The outer walk visits the inner loop's regions (reading `a`) before
# the inner loop's own operands (reading `b`), so the outer captures `a`, then `b`.
NESTED = """HloModule nested, num_partitions=8

inner_body {
  p = (s32[], f32[8], f32[1,8]) parameter(0)
  j = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  next = s32[] add(j, one)
  z = f32[8] get-tuple-element(p), index=1
  a = f32[1,8] get-tuple-element(p), index=2
  ar = f32[8] reshape(a)
  y = f32[8] add(z, ar)
  ROOT t = (s32[], f32[8], f32[1,8]) tuple(next, y, a)
}

inner_cond {
  p = (s32[], f32[8], f32[1,8]) parameter(0)
  j = s32[] get-tuple-element(p), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(j, n), direction=LT
}

body {
  p = (s32[], f32[8], f32[1,8], f32[8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  next = s32[] add(i, one)
  x = f32[8] get-tuple-element(p), index=1
  a = f32[1,8] get-tuple-element(p), index=2
  b = f32[8] get-tuple-element(p), index=3
  zero = s32[] constant(0)
  inner_init = (s32[], f32[8], f32[1,8]) tuple(zero, b, a)
  inner = (s32[], f32[8], f32[1,8]) while(inner_init), condition=inner_cond, body=inner_body
  z = f32[8] get-tuple-element(inner), index=1
  y = f32[8] add(x, z)
  ROOT t = (s32[], f32[8], f32[1,8], f32[8]) tuple(next, y, a, b)
}

cond {
  p = (s32[], f32[8], f32[1,8], f32[8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(2)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY e {
  x = f32[8] parameter(0)
  a = f32[1,8] parameter(1)
  b = f32[8] parameter(2)
  zero = s32[] constant(0)
  init = (s32[], f32[8], f32[1,8], f32[8]) tuple(zero, x, a, b)
  loop = (s32[], f32[8], f32[1,8], f32[8]) while(init), condition=cond, body=body
  ROOT r = f32[8] get-tuple-element(loop), index=1
}
"""

# Compiled by XLA (Shardy, 8 CPU devices; `RULES_AFTER` is its loops after shardy-xla): a counter
# bound `n` read by the condition, twins `a`/`b` of `w`, a pass-through `c` read only after the loop,
# a constant `k`, a scalar `s` read twice, an iota read by both loops, a broadcast of `s` read by
# both loops (its copies merged), and `d`, which returns `a` and so stays.
RULES = """HloModule rules, num_partitions=8

inner_body {
  p = (s32[], f32[8,16], f32[16], f32[8,16]) parameter(0)
  j = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  next = s32[] add(j, one)
  z = f32[8,16] get-tuple-element(p), index=1
  io = f32[16] get-tuple-element(p), index=2
  iob = f32[8,16] broadcast(io), dimensions={1}
  fill = f32[8,16] get-tuple-element(p), index=3
  za = f32[8,16] add(z, iob)
  zb = f32[8,16] multiply(za, fill)
  ROOT t = (s32[], f32[8,16], f32[16], f32[8,16]) tuple(next, zb, io, fill)
}

inner_cond {
  p = (s32[], f32[8,16], f32[16], f32[8,16]) parameter(0)
  j = s32[] get-tuple-element(p), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(j, n), direction=LT
}

body {
  p = (s32[], f32[8,16], f32[8,16], f32[8,16], f32[8,16], f32[], f32[], f32[16], f32[8,16], s32[], f32[8,16]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  next = s32[] add(i, one)
  x = f32[8,16] get-tuple-element(p), index=1
  a = f32[8,16] get-tuple-element(p), index=2
  b = f32[8,16] get-tuple-element(p), index=3
  c = f32[8,16] get-tuple-element(p), index=4
  k = f32[] get-tuple-element(p), index=5
  s = f32[] get-tuple-element(p), index=6
  io = f32[16] get-tuple-element(p), index=7
  fill = f32[8,16] get-tuple-element(p), index=8
  d = f32[8,16] get-tuple-element(p), index=10
  nn = s32[] get-tuple-element(p), index=9
  zero = s32[] constant(0)
  inner_init = (s32[], f32[8,16], f32[16], f32[8,16]) tuple(zero, x, io, fill)
  inner = (s32[], f32[8,16], f32[16], f32[8,16]) while(inner_init), condition=inner_cond, body=inner_body
  y0 = f32[8,16] get-tuple-element(inner), index=1
  ks = f32[] multiply(k, s)
  kb = f32[8,16] broadcast(ks), dimensions={}
  sb = f32[8,16] broadcast(s), dimensions={}
  iob = f32[8,16] broadcast(io), dimensions={1}
  y1 = f32[8,16] multiply(y0, kb)
  y2 = f32[8,16] add(y1, sb)
  y3 = f32[8,16] add(y2, a)
  y4 = f32[8,16] add(y3, b)
  y5 = f32[8,16] add(y4, iob)
  y6 = f32[8,16] multiply(y5, fill)
  y7 = f32[8,16] add(y6, d)
  ROOT t = (s32[], f32[8,16], f32[8,16], f32[8,16], f32[8,16], f32[], f32[], f32[16], f32[8,16], s32[], f32[8,16]) tuple(next, y7, a, a, c, k, s, io, fill, nn, a)
}

cond {
  p = (s32[], f32[8,16], f32[8,16], f32[8,16], f32[8,16], f32[], f32[], f32[16], f32[8,16], s32[], f32[8,16]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] get-tuple-element(p), index=9
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY e {
  x = f32[8,16] parameter(0), sharding={mesh['a'=2,'b'=4], [{'a'}, {}]}
  w = f32[8,16] parameter(1), sharding={mesh['a'=2,'b'=4], [{}, {'b'}]}
  v = f32[8,16] parameter(2), sharding={mesh['a'=2,'b'=4], [{}, {}]}
  s = f32[] parameter(3), sharding={mesh['a'=2,'b'=4], []}
  n = s32[] parameter(4), sharding={mesh['a'=2,'b'=4], []}
  zero = s32[] constant(0)
  two = f32[] constant(2)
  io = f32[16] iota(), iota_dimension=0
  fill = f32[8,16] broadcast(s), dimensions={}
  init = (s32[], f32[8,16], f32[8,16], f32[8,16], f32[8,16], f32[], f32[], f32[16], f32[8,16], s32[], f32[8,16]) tuple(zero, x, w, w, v, two, s, io, fill, n, x)
  loop = (s32[], f32[8,16], f32[8,16], f32[8,16], f32[8,16], f32[], f32[], f32[16], f32[8,16], s32[], f32[8,16]) while(init), condition=cond, body=body
  r = f32[8,16] get-tuple-element(loop), index=1
  q = f32[8,16] get-tuple-element(loop), index=4
  ROOT out = (f32[8,16], f32[8,16]) tuple(r, q)
}
"""
RULES_AFTER = [
    ["s32[]", "f32[8,16]", "f32[8,16]", "s32[]", "f32[16]", "f32[8,16]", "f32[]", "f32[8,16]", "f32[16]"],
    ["s32[]", "f32[8,16]", "f32[16]", "f32[8,16]"],
]


@pytest.mark.parametrize(("text", "expected"), [pytest.param(t, e, id=i) for i, t, e in RULE_CASES])
def test_rule(text: str, expected: list[list[str]]) -> None:
    assert [shapes for _, shapes in loops(round_trip(text))] == expected


def test_element_returned_at_another_position_leaves_the_module_alone() -> None:
    module = parse_hlo(RULE["elements_returned_at_another_position_stay"])
    assert not ShardyRoundTrip().run(module).changed


def test_broadcast_of_a_scalar_is_one_capture_unless_merging_is_off() -> None:
    """ConstantOrScalarMerger folds the copies of `fill = broadcast(s)` the body's two readers get when
    propagation gives them one sharding (measured); with different shardings each reader keeps its own."""
    text = scan(
        "f32[8], f32[8]",
        """  x = f32[8] get-tuple-element(p), index=1
  f = f32[8] get-tuple-element(p), index=2
  y0 = f32[8] add(x, f)
  y = f32[8] multiply(y0, f)
  ROOT t = (s32[], f32[8], f32[8]) tuple(next, y, f)""",
        "x, fill",
        entry="  fill = f32[8] broadcast(s), dimensions={}",
    )
    assert [s for _, s in loops(round_trip(text))] == [["s32[]", "f32[8]", "f32[8]"]]
    assert [s for _, s in loops(round_trip(text, merge_broadcasts=False))] == [["s32[]", "f32[8]", "f32[8]", "f32[8]"]]


def test_nested_loop_regions_are_walked_before_its_operands() -> None:
    assert loops(round_trip(NESTED)) == [
        ("loop", ["s32[]", "f32[8]", "f32[1,8]", "f32[8]"]),
        ("inner", ["s32[]", "f32[8]", "f32[1,8]"]),
    ]


def test_reads_of_a_dropped_element_read_its_start_value() -> None:
    """Inside, the body reads the capture; after the loop, readers of result i read the init value."""
    text = scan(
        "f32[8], f32[8]",
        """  x = f32[8] get-tuple-element(p), index=1
  f = f32[8] get-tuple-element(p), index=2
  y = f32[8] add(x, f)
  ROOT t = (s32[], f32[8], f32[8]) tuple(next, y, f)""",
        "x, v",
    ).replace(
        "ROOT r = f32[8] get-tuple-element(loop), index=1",
        """r = f32[8] get-tuple-element(loop), index=1
  r2 = f32[8] get-tuple-element(loop), index=2
  ROOT out = (f32[8], f32[8]) tuple(r, r2)""",
    )
    rewrite = ShardyRoundTrip().run(parse_hlo(text))
    module = rewrite.module
    check_valid(module)
    assert module.entry.root.operands == ("r", "v")
    assert rewrite.renamed["r2"] == "v"
    body = module.computation("body")
    read = body[body["y"].operands[1]]
    assert (read.opcode, read.attr("index")) == ("get-tuple-element", 2)
    assert body[body.root.operands[2]].name == read.name  # the capture passes through


def test_captured_constant_lives_in_the_body() -> None:
    module = round_trip(RULE["captured_constant_is_copied_in"])
    body = module.computation("body")
    operand = body[body[body["y"].operands[1]].operands[0]]
    assert (operand.opcode, operand.literal) == ("constant", "2")


def test_copies_of_a_constant_expression_keep_the_original_name_first() -> None:
    """The splitter's copies of `table` (and the body's `row`): the first takes the erased original's name."""
    module = round_trip(RULE["reshape_of_a_constant_read_twice_is_two_captures"])
    entry, body = module.entry, module.computation("body")
    init = entry[entry["loop"].operands[0]]
    assert [entry[o].opcode for o in init.operands[2:]] == ["reshape", "reshape"]
    assert init.operands[2] == "table"
    readers = (body["y0"].operands[1], body["y"].operands[1])
    assert "row" in readers and readers[0] != readers[1]


CALLED = """HloModule called, num_partitions=8

body {
  p = (s32[], f32[8,8], f32[8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  next = s32[] add(i, one)
  wt = f32[8,8] get-tuple-element(p), index=1
  x = f32[8] get-tuple-element(p), index=2
  y = f32[8] dot(wt, x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = (s32[], f32[8,8], f32[8]) tuple(next, wt, y)
}

cond {
  p = (s32[], f32[8,8], f32[8]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(4)
  ROOT lt = pred[] compare(i, n), direction=LT
}

shmap_body {
  a = f32[8] parameter(0)
  b = f32[8,8] parameter(1)
  zero = s32[] constant(0)
  init = (s32[], f32[8,8], f32[8]) tuple(zero, b, a)
  loop = (s32[], f32[8,8], f32[8]) while(init), condition=cond, body=body
  ROOT r = f32[8] get-tuple-element(loop), index=2
}

ENTRY e {
  x = f32[8] parameter(0)
  w = f32[8,8] parameter(1)
  ROOT c = f32[8] call(x, w), to_apply=shmap_body
}
"""


def test_loop_in_a_callee_is_walked_from_the_callee() -> None:
    """A callee the front passes keep (a shard_map body) holds its loops as the entry holds its own."""
    module = round_trip(CALLED)
    (loop,) = [i for i in module.computation("shmap_body") if i.opcode == "while"]
    assert [e.to_text(False) for e in loop.shape.leaves()] == ["s32[]", "f32[8]", "f32[8,8]"]
    body = module.computation("body")
    assert body[body["y"].operands[0]].attr("index") == 2


def test_a_loop_read_whole_is_refused() -> None:
    text = RULE["pass_through_is_captured_after_the_carries"].replace(
        "ROOT r = f32[8] get-tuple-element(loop), index=2", "ROOT r = (s32[], f32[8,8], f32[8]) copy(loop)"
    )
    with pytest.raises(UnsupportedHlo, match="whole"):
        ShardyRoundTrip().run(parse_hlo(text))


def test_hand_written_module_against_xla() -> None:
    """The twins go (one capture of `w`), `c` goes with no capture (only read after the loop, which reads
    `v`), `k` is copied in, `s` is captured once, the iota once per reader (the inner loop's, then the
    outer body's), the broadcast of `s` once, `n` first (the condition is walked first), `d` stays."""
    assert [shapes for _, shapes in loops(round_trip(RULES))] == RULES_AFTER


def _fixture_cases() -> list[tuple[str, str, dict]]:
    cases = json.loads(FIXTURE.read_text())["cases"]
    return [(name, compiler, want) for name, entry in cases.items() for compiler, want in entry.items()]


def _fingerprint(found: list[tuple[str, list[str]]]) -> str:
    return hashlib.sha256("\n".join(" ".join(shapes) for _, shapes in found).encode()).hexdigest()[:16]


def _cached_inputs(case: str, compiler: str) -> list[HloModule]:
    """The cached module entering shardy-xla: XLA:TPU's as recorded, XLA:CPU's the lowered step
    through the planner's front passes (XLA:CPU runs only those before shardy-xla)."""
    suffix = ".tpu_pre_propagation.hlo" if compiler == "tpu" else ".hlo"
    modules = [parse_hlo_file(p) for p in sorted(cache_dir().glob(f"*/{case}{suffix}"))]
    return modules if compiler == "tpu" else [CallInlining().run(m).module for m in modules]


@pytest.mark.parametrize(
    ("case", "compiler", "want"), [pytest.param(*c, id=f"{c[0]}-{c[1]}") for c in _fixture_cases()]
)
def test_jax_step_against_xla_dump(case: str, compiler: str, want: dict) -> None:
    inputs = [m for m in _cached_inputs(case, compiler) if _fingerprint(loops(m)) == want["input_loops"]]
    if not inputs:
        pytest.skip(f"no cached input of {case} with the loops XLA's dump was measured on")
    for module in inputs:
        after = ShardyRoundTrip().run(module).module
        assert [" ".join(shapes) for _, shapes in loops(after)] == want["loops"]

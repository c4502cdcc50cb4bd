"""Bad HLO gets an HloParseError naming line, column and what was expected."""

from __future__ import annotations

import pytest

from planner import HloParseError, parse_hlo

HEAD = "HloModule m\n\n"
ADD = "add {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n  ROOT s = f32[] add(x, y)\n}\n\n"

# (id, text, line, column, words the message must contain)
CASES = [
    ("empty", "", 1, 1, "expected 'HloModule'"),
    ("no_header", "ENTRY e {\n  ROOT p = f32[2] parameter(0)\n}\n", 1, 1, "expected 'HloModule'"),
    ("no_computation", "HloModule m\n", 2, 1, "the module has none"),
    ("truncated_in_body", HEAD + "ENTRY e {\n  p = f32[2] parameter(0)\n", 5, 1, "input ends inside computation 'e'"),
    (
        "truncated_in_operands",
        HEAD + "ENTRY e {\n  p = f32[2] parameter(0)\n  ROOT a = f32[2] add(p,",
        5,
        25,
        "expected an operand name, found end of input",
    ),
    ("truncated_in_tuple_shape", HEAD + "ENTRY e {\n  p = (f32[2], f32[3]", 4, 7, "unclosed '(' in tuple shape"),
    (
        "unclosed_sharding",
        HEAD + "ENTRY e {\n  ROOT p = f32[4] parameter(0), sharding={devices=[2]0,1",
        4,
        42,
        "input ends inside a sharding: expected '}'",
    ),
    (
        "unclosed_metadata_string",
        HEAD + 'ENTRY e {\n  ROOT p = f32[4] parameter(0), metadata={op_name="x}\n}\n',
        4,
        43,
        "expected a metadata field",
    ),
    (
        "stray_closing_brace",
        HEAD + "ENTRY e {\n  ROOT p = f32[4] parameter(0)\n}\n}\n",
        6,
        1,
        "expected a computation name",
    ),
    (
        "unknown_element_type",
        HEAD + "ENTRY e {\n  ROOT p = f33[4] parameter(0)\n}\n",
        4,
        12,
        "unknown element type 'f33'",
    ),
    ("bad_dimension", HEAD + "ENTRY e {\n  ROOT p = f32[4,x] parameter(0)\n}\n", 4, 18, "bad dimension 'x'"),
    (
        "duplicate_instruction",
        HEAD + "ENTRY e {\n  p = f32[4] parameter(0)\n  p = f32[4] copy(p)\n}\n",
        5,
        3,
        "instruction 'p' is defined twice",
    ),
    (
        "duplicate_computation",
        HEAD + ADD + ADD + "ENTRY e {\n  ROOT p = f32[] parameter(0)\n}\n",
        9,
        1,
        "computation 'add' is defined twice",
    ),
    (
        "undefined_operand",
        HEAD + "ENTRY e {\n  p = f32[4] parameter(0)\n  ROOT a = f32[4] add(p, q)\n}\n",
        5,
        26,
        "operand 'q' of 'a' is not defined",
    ),
    (
        "use_before_definition",
        HEAD + "ENTRY e {\n  ROOT a = f32[4] negate(p)\n  p = f32[4] parameter(0)\n}\n",
        4,
        26,
        "operand 'p' of 'a' is not defined",
    ),
    (
        "undefined_computation",
        HEAD + "ENTRY e {\n  p = f32[4] parameter(0)\n  c = f32[] constant(0)\n"
        "  ROOT r = f32[] reduce(p, c), dimensions={0}, to_apply=%nope\n}\n",
        6,
        48,
        "computation 'nope' is not defined",
    ),
    (
        "unknown_opcode",
        HEAD + "ENTRY e {\n  p = f32[4] parameter(0)\n  ROOT a = f32[4] ad(p, p)\n}\n",
        5,
        19,
        "unknown opcode 'ad'",
    ),
    (
        "wrong_arity",
        HEAD + "ENTRY e {\n  p = f32[4] parameter(0)\n  ROOT a = f32[4] add(p)\n}\n",
        5,
        19,
        "add takes 2 operands, got 1",
    ),
    (
        "call_cycle",
        HEAD + "a {\n  p = f32[] parameter(0)\n  ROOT c = f32[] call(p), to_apply=b\n}\n\n"
        "b {\n  p = f32[] parameter(0)\n  ROOT c = f32[] call(p), to_apply=a\n}\n\n"
        "ENTRY e {\n  p = f32[] parameter(0)\n  ROOT c = f32[] call(p), to_apply=a\n}\n",
        5,
        27,
        "computation 'b' is not defined before its use in 'a'",
    ),
    (
        "tile_count_mismatch",
        HEAD + "ENTRY e {\n  ROOT p = f32[4,4] parameter(0), sharding={devices=[2,2]0,1,2}\n}\n",
        4,
        58,
        "3 devices listed but tile dims [2, 2] need 4",
    ),
    (
        "sharding_rank_mismatch",
        HEAD + "ENTRY e {\n  ROOT p = f32[4] parameter(0), sharding={devices=[2,2]<=[4]}\n}\n",
        4,
        8,
        "2 tiled dims but f32[4] has rank 1",
    ),
    (
        "tuple_index_out_of_range",
        HEAD + "ENTRY e {\n  p = (f32[4], f32[2]) parameter(0)\n  ROOT g = f32[4] get-tuple-element(p), index=2\n}\n",
        5,
        8,
        "index 2 is out of range",
    ),
    (
        "missing_equals",
        HEAD + "ENTRY e {\n  ROOT p f32[4] parameter(0)\n}\n",
        4,
        10,
        "expected '=' after instruction name 'p'",
    ),
    (
        "second_root",
        HEAD + "ENTRY e {\n  ROOT p = f32[4] parameter(0)\n  ROOT q = f32[4] copy(p)\n}\n",
        5,
        8,
        "has a second ROOT",
    ),
    (
        "parameter_gap",
        HEAD + "ENTRY e {\n  p = f32[4] parameter(0)\n  ROOT q = f32[4] parameter(2)\n}\n",
        3,
        1,
        "must be numbered 0..1, found [0, 2]",
    ),
    (
        "bad_subgroup_type",
        HEAD + "ENTRY e {\n  ROOT p = f32[4] parameter(0), sharding={devices=[2,2]<=[4] "
        "last_tile_dims={sideways}}\n}\n",
        4,
        78,
        "unknown subgroup type 'sideways'",
    ),
    (
        "junk_after_value",
        HEAD + "ENTRY e {\n  p = (f32[4]) parameter(0)\n  ROOT g = f32[4] get-tuple-element(p), index=0x\n}\n",
        5,
        48,
        "unexpected 'x' after the value of 'index'",
    ),
    ("nul_byte", HEAD + "ENTRY e {\n  ROOT p = f32[4] parameter(0)\x00\n}\n", 4, 31, "NUL byte"),
    # Shapes that do not fit operands or attributes, refused where written (as XLA's verifier does).
    (
        "tuple_arity",
        HEAD + "ENTRY e {\n  p = f32[4] parameter(0)\n  ROOT t = (f32[4]) tuple(p, p)\n}\n",
        5,
        8,
        "tuple has 2 operands but its shape has 1 elements",
    ),
    (
        "tuple_element",
        HEAD + "ENTRY e {\n  p = f32[4] parameter(0)\n  ROOT t = (f32[5]) tuple(p)\n}\n",
        5,
        8,
        "tuple element 0 is declared f32[5] but its operand is f32[4]",
    ),
    (
        "gte_shape",
        HEAD + "ENTRY e {\n  p = (f32[4], s32[]) parameter(0)\n  ROOT g = f32[5] get-tuple-element(p), index=0\n}\n",
        5,
        8,
        "declared f32[5] but element 0 of 'p' is f32[4]",
    ),
    (
        "broadcast_dims",
        HEAD + "ENTRY e {\n  p = f32[4] parameter(0)\n  ROOT b = f32[4,8] broadcast(p), dimensions={5}\n}\n",
        5,
        21,
        "broadcast dimensions [5] name dims [5] outside rank 2",
    ),
    (
        "transpose_perm",
        HEAD + "ENTRY e {\n  p = f32[4,8] parameter(0)\n  ROOT t = f32[8,4] transpose(p), dimensions={0,0}\n}\n",
        5,
        21,
        "is not a permutation of 2 dims",
    ),
    (
        "reshape_count",
        HEAD + "ENTRY e {\n  p = f32[4,8] parameter(0)\n  ROOT r = f32[30] reshape(p)\n}\n",
        5,
        20,
        "changes the element count",
    ),
    (
        "dot_dims",
        HEAD
        + "ENTRY e {\n  a = f32[4,8] parameter(0)\n  b = f32[6,4] parameter(1)\n  ROOT d = f32[4,4] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n",
        6,
        21,
        "dot pairs lhs dim 1 (8) with rhs dim 0 (6)",
    ),
    (
        "slice_range",
        HEAD + "ENTRY e {\n  p = f32[4] parameter(0)\n  ROOT s = f32[2] slice(p), slice={[3:9]}\n}\n",
        5,
        19,
        "slice range [3:9:1] does not fit dim 0 of size 4",
    ),
    (
        "elementwise_dims",
        HEAD + "ENTRY e {\n  a = f32[4] parameter(0)\n  b = f32[5] parameter(1)\n  ROOT s = f32[4] add(a, b)\n}\n",
        6,
        19,
        "operand 1 is f32[5] but the result is f32[4]",
    ),
    (
        "layout_order",
        HEAD + "ENTRY e {\n  ROOT p = f32[4,8]{1,,0} parameter(0)\n}\n",
        4,
        20,
        "layout {1,,0} is not an order of the 2 dims",
    ),
    (
        "gather_index_map",
        HEAD
        + "ENTRY e {\n  o = f32[8,4] parameter(0)\n  i = s32[3,1] parameter(1)\n  ROOT g = f32[3,4] gather(o, i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={11}, index_vector_dim=1, slice_sizes={1,4}\n}\n",
        6,
        21,
        "start_index_map [11] name dims [11] outside rank 2",
    ),
]


@pytest.mark.parametrize("text,line,column,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_error_is_located(text: str, line: int, column: int, message: str) -> None:
    with pytest.raises(HloParseError) as info:
        parse_hlo(text, source="bad.hlo")
    error = info.value
    assert (error.line, error.column) == (line, column), str(error)
    assert message in error.message
    # The rendered message quotes the line and puts a caret under the column.
    rendered = str(error).splitlines()
    assert rendered[0].startswith(f"bad.hlo:{line}:{column}: ")
    quoted, caret = rendered[1], rendered[2]
    assert caret.index("^") - 2 == column - 1 or "..." in quoted


def test_long_line_is_clipped_around_the_column() -> None:
    operands = ", ".join(f"p{i}" for i in range(2000))
    params = "\n".join(f"  p{i} = f32[] parameter({i})" for i in range(2000))
    text = f"HloModule m\n\nENTRY e {{\n{params}\n  ROOT t = (f32[]) tuple({operands}, nope)\n}}\n"
    with pytest.raises(HloParseError) as info:
        parse_hlo(text)
    quoted, caret = str(info.value).splitlines()[1:3]
    assert len(quoted) < 200
    assert quoted[caret.index("^") :].startswith("nope")


def test_error_from_cli_exits_2_with_location(tmp_path) -> None:
    from cli import main

    bad = tmp_path / "bad.hlo"
    bad.write_text(HEAD + "ENTRY e {\n  ROOT a = f32[4] add(p, q)\n}\n")
    assert main(["parse", str(bad)]) == 2

"""What XLA's own parser (jaxlib 0.7.1) refuses, ours refuses at the place it goes wrong; what it takes, ours takes.

The cases are the rules the differential test (test_parse_differential.py)
found: attribute names per opcode, metadata and window fields, constant
literals, operand types, tuple element sizes, layouts, signatures, callees
defined before use. The xla-marked tests check each verdict against jaxlib.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from xla_parser_oracle import XlaParser

from planner.errors import HloParseError
from planner.hlo.text.parser import parse_hlo

HEAD = "HloModule m\n\n"
ADD = HEAD + "add {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n  ROOT s = f32[] add(x, y)\n}\n\n"
P = "ENTRY e {\n  p = f32[4] parameter(0)\n"


def entry(*lines: str) -> str:
    return HEAD + P + "".join(f"  {line}\n" for line in lines) + "}\n"


# (id, text, line, column, words the message must contain)
REFUSED = [
    ("unknown_attribute", entry("ROOT r = f32[4] negate(p), dimensions={0}"), 5, 30, "negate takes no attribute 'dimensions'"),
    ("missing_attribute", entry("ROOT r = pred[4] compare(p, p)"), 5, 20, "compare needs direction="),
    ("metadata_unquoted", entry('ROOT r = f32[4] negate(p), metadata={op_name=x}'), 5, 30, "needs a quoted string"),
    ("metadata_twice", entry('ROOT r = f32[4] negate(p), metadata={op_name="a" op_name="b"}'), 5, 30, "given twice"),
    ("metadata_unknown", entry('ROOT r = f32[4] negate(p), metadata={colour="red"}'), 5, 30, "unknown metadata field"),
    ("metadata_in_sharding", entry('ROOT r = f32[4] negate(p), sharding={replicated metadata={source_line=x}}'), 5, 30, "32-bit integer"),
    ("window_without_size", ADD + entry("z = f32[] constant(0)", "ROOT r = f32[4] reduce-window(p, z), window={stride=2}, to_apply=add")[len(HEAD):], 12, 40, "window field 'stride' has 1 dims, size has 0"),
    ("literal_junk", entry("ROOT c = f32[] constant(1x)"), 5, 27, "unexpected 'x'"),
    ("literal_count", entry("ROOT c = f32[2] constant({1, 2, 3})"), 5, 28, "expects 2 elements in dim 0"),
    ("literal_range", entry("ROOT c = s8[] constant(128)"), 5, 26, "128 is not a s8 value"),
    ("literal_float_range", entry("ROOT c = f16[] constant(70000)"), 5, 27, "70000 is not a f16 value"),
    ("operand_type", entry("ROOT r = f32[4] negate(f32[5] p)"), 5, 33, "operand 'p' is declared f32[5] but is f32[4]"),
    ("tuple_element_too_big", entry("ROOT t = (f32[4611686018427387904]) parameter(1)"), 5, 12, "its bytes overflow int64"),
    ("dim_beyond_int64", entry("ROOT q = f32[9223372036854775808] parameter(1)"), 5, 16, "does not fit in int64"),
    ("layout_tail", entry("ROOT q = f32[4]{0:Q(1)} parameter(1)"), 5, 18, "after ':'"),
    ("signature_percent_colon", HEAD + "ENTRY e (%p: f32[4]) -> f32[4] {\n  ROOT p = f32[4] parameter(0)\n}\n", 3, 10, "a parameter name"),
    ("signature_result", HEAD + "ENTRY e (p: f32[4]) -> s32[4] {\n  ROOT p = f32[4] parameter(0)\n}\n", 3, 1, "by its signature but its root"),
    ("computation_attribute_before_body", HEAD + 'ENTRY e, execution_thread="main" {\n  ROOT p = f32[4] parameter(0)\n}\n', 3, 8, "expected '{'"),
    ("computation_attribute_unknown", HEAD + 'ENTRY e {\n  ROOT p = f32[4] parameter(0)\n}, colour="red"\n', 5, 4, "unexpected attribute 'colour'"),
    ("entry_layout", "HloModule m, entry_computation_layout={(f32[4])}\n\n" + P + "}\n", 1, 48, "bad entry_computation_layout"),
    ("callee_later", HEAD + "ENTRY e {\n  p = f32[] parameter(0)\n  ROOT r = f32[] call(p), to_apply=f\n}\n\nf {\n  ROOT x = f32[] parameter(0)\n}\n", 5, 27, "computation 'f' is not defined before its use in 'e'"),
    ("dot_one_operand", entry("ROOT d = f32[] dot(p), lhs_contracting_dims={0}, rhs_contracting_dims={0}"), 5, 18, "dot takes at least 2 operands, got 1"),
]  # fmt: skip

# Texts XLA reads that an earlier version of our parser refused.
ACCEPTED = [
    ("execution_thread_after_body", HEAD + 'ENTRY e {\n  ROOT p = f32[4] parameter(0)\n}, execution_thread="host"\n'),
    ("metadata_commas", entry('ROOT r = f32[4] negate(p), metadata={op_name="a", op_type="b"}')),
    ("signature_without_colon", HEAD + "ENTRY e (p f32[4]) -> f32[4] {\n  ROOT p = f32[4] parameter(0)\n}\n"),
    ("signature_ignores_parameters", HEAD + "ENTRY e (a: s32[], b: s32[]) -> f32[4] {\n  ROOT p = f32[4] parameter(0)\n}\n"),
    ("literal_lone_comma", entry("ROOT c = f32[2] constant(,)")),
    ("literal_elided", entry("ROOT c = f32[2,2] constant({...})")),
    ("dot_three_operands", entry("ROOT d = f32[] dot(p, p, p), lhs_contracting_dims={0}, rhs_contracting_dims={0}")),
    ("ragged_all_to_all_any_count", entry("ROOT r = f32[4] ragged-all-to-all(p)")),
]  # fmt: skip

# Deliberately read although jaxlib 0.7.1 refuses them: attribute names it knows nowhere, as newer XLA
# writes (see opcode_attributes.KNOWN_KEYS); each is kept verbatim.
NEWER_XLA = [
    ("new_instruction_attribute", entry("ROOT r = f32[4] negate(p), result_layout_hint={1}")),
    ("new_module_attribute", "HloModule m, launch_bounds=1\n\n" + P + "}\n"),
]  # fmt: skip


@pytest.fixture(scope="module")
def xla() -> Iterator[XlaParser]:
    with XlaParser() as parser:
        yield parser


@pytest.mark.parametrize("text,line,column,message", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused_where_it_goes_wrong(text: str, line: int, column: int, message: str) -> None:
    with pytest.raises(HloParseError) as info:
        parse_hlo(text)
    assert (info.value.line, info.value.column) == (line, column), str(info.value)
    assert message in info.value.message


@pytest.mark.parametrize("text", [c[1] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_accepted(text: str) -> None:
    parse_hlo(text)


@pytest.mark.xla
@pytest.mark.parametrize("text", [c[1] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_xla_refuses_too(text: str, xla: XlaParser) -> None:
    assert not xla.parse(text).accepted


@pytest.mark.xla
@pytest.mark.parametrize("text", [c[1] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_xla_accepts_too(text: str, xla: XlaParser) -> None:
    verdict = xla.parse(text)
    assert verdict.accepted, verdict.error


@pytest.mark.xla
@pytest.mark.parametrize("text", [c[1] for c in NEWER_XLA], ids=[c[0] for c in NEWER_XLA])
def test_newer_xla_attributes_are_kept(text: str, xla: XlaParser) -> None:
    assert not xla.parse(text).accepted  # jaxlib 0.7.1 refuses the name ...
    module = parse_hlo(text)  # ... we keep it
    kept = [a.text for c in module.computations for i in c.instructions for a in i.attributes]
    kept += [a.text for a in module.attributes]
    assert "{1}" in kept or "1" in kept

"""Instructions written without a shape get the shape XLA's parser infers, or XLA's refusal.

Each case is a small module whose ROOT `result` has no shape. The xla-marked
tests hand the same text to jaxlib 0.7.1 (in a worker process) and compare
what it prints for `result` with our inferred shape, layout included.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from xla_parser_oracle import XlaParser

from planner.errors import HloParseError
from planner.hlo.inference.shapes import infer_shape
from planner.hlo.ir.module import Attribute
from planner.hlo.text.parser import parse_hlo

ADD = "%add (x: f32[], y: f32[]) -> f32[] {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n  ROOT s = f32[] add(x, y)\n}\n"
GE = "%ge {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n  ROOT c = pred[] compare(x, y), direction=GE\n}\n"
NEG = "%neg {\n  x = f32[] parameter(0)\n  ROOT n = f32[] negate(x)\n}\n"
EXP = "%exp {\n  x = f32[] parameter(0)\n  ROOT n = f32[] exponential(x)\n}\n"
ARGMAX = (
    "%argmax {\n  a = f32[] parameter(0)\n  i = s32[] parameter(1)\n  b = f32[] parameter(2)\n  j = s32[] parameter(3)\n"
    "  m = f32[] maximum(a, b)\n  k = s32[] maximum(i, j)\n  ROOT t = (f32[], s32[]) tuple(m, k)\n}\n"
)
LESS = "%less {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n  ROOT c = pred[] compare(x, y), direction=LT\n}\n"
# XLA's own style (hlo_parser_test.cc): a While whose shape is left to the parser.
LOOP = (
    "%cond (p: (f32[4], s32[])) -> pred[] {\n  p = (f32[4], s32[]) parameter(0)\n  i = s32[] get-tuple-element(p), index=1\n"
    "  n = s32[] constant(8)\n  ROOT lt = pred[] compare(i, n), direction=LT\n}\n"
    "%body (p: (f32[4], s32[])) -> (f32[4], s32[]) {\n  p = (f32[4], s32[]) parameter(0)\n"
    "  v = f32[4] get-tuple-element(p), index=0\n  i = s32[] get-tuple-element(p), index=1\n  one = s32[] constant(1)\n"
    "  j = s32[] add(i, one)\n  ROOT t = (f32[4], s32[]) tuple(v, j)\n}\n"
)
PARAMS = (
    "  a = f32[4,8] parameter(0)\n  b = f32[4,8] parameter(1)\n  m = pred[4,8] parameter(2)\n  s = f32[] parameter(3)\n"
    "  i = s32[4,8] parameter(4)\n  t = (f32[4,8], s32[]) parameter(5)\n  c = c64[4,8] parameter(6)\n"
    "  u = u32[4,8] parameter(7)\n  col = f32[4,1] parameter(8)\n  row = f32[1,8] parameter(9)\n"
    "  h = bf16[4,8] parameter(10)\n  d = f32[4,<=8] parameter(11)\n  l = f32[4,8]{0,1} parameter(12)\n"
    "  z = f32[] constant(0)\n  k = s32[] parameter(13)\n  p = pred[] parameter(14)\n"
)


def module(root: str, computations: str = "", params: str = PARAMS) -> str:
    return f"HloModule m\n\n{ADD}{computations}\nENTRY %e {{\n{params}  ROOT result = {root}\n}}\n"


# (id, root instruction without its shape, computations it calls, parameters if not PARAMS)
INFERRED = [
    ("abs", "abs(a)", "", None),
    ("abs_complex", "abs(c)", "", None),
    ("negate_unsigned", "negate(u)", "", None),
    ("sqrt", "sqrt(a)", "", None),
    ("cosine_complex", "cosine(c)", "", None),
    ("is_finite", "is-finite(a)", "", None),
    ("real", "real(c)", "", None),
    ("imag_of_real", "imag(a)", "", None),
    ("not_pred", "not(m)", "", None),
    ("popcnt", "popcnt(i)", "", None),
    ("count_leading_zeros", "count-leading-zeros(u)", "", None),
    ("sign_int", "sign(i)", "", None),
    ("round_nearest_even", "round-nearest-even(a)", "", None),
    ("copy_keeps_layout", "copy(l)", "", None),
    ("copy_tuple", "copy(t)", "", None),
    ("add", "add(a, b)", "", None),
    ("add_keeps_lhs_layout", "add(l, a)", "", None),
    ("add_mixed_float", "add(h, a)", "", None),
    ("add_bounded", "add(a, d)", "", None),
    ("subtract", "subtract(a, b)", "", None),
    ("divide_int", "divide(i, i)", "", None),
    ("power", "power(a, b)", "", None),
    ("atan2", "atan2(a, b)", "", None),
    ("and_pred", "and(m, m)", "", None),
    ("xor_unsigned", "xor(u, u)", "", None),
    ("shift_left", "shift-left(i, i)", "", None),
    ("complex", "complex(a, b)", "", None),
    ("compare", "compare(a, b), direction=LT", "", None),
    ("select", "select(m, a, b)", "", None),
    ("select_scalar_pred", "select(p, a, b)", "", None),
    ("clamp", "clamp(a, b, a)", "", None),
    ("clamp_scalar_bounds", "clamp(s, a, s)", "", None),
    ("tuple", "tuple(a, k, t)", "", None),
    ("tuple_empty", "tuple()", "", None),
    ("get_tuple_element", "get-tuple-element(t), index=0", "", None),
    ("while", "while(init), condition=%cond, body=%body", LOOP,
     "  v = f32[4] parameter(0)\n  zero = s32[] constant(0)\n  init = (f32[4], s32[]) tuple(v, zero)\n"),
    ("call", "call(a, b), to_apply=%pair", "%pair {\n  x = f32[4,8] parameter(0)\n  y = f32[4,8] parameter(1)\n  ROOT t = (f32[4,8], f32[4,8]) tuple(x, y)\n}\n", None),
    ("conditional_pred", "conditional(p, s, s), true_computation=%neg, false_computation=%exp", NEG + EXP, None),
    ("conditional_index", "conditional(k, s, s, s), branch_computations={%neg, %exp, %neg}", NEG + EXP, None),
    ("after_all", "after-all()", "", None),
    ("add_dependency", "add-dependency(a, tok)", "", PARAMS + "  tok = token[] after-all()\n"),
    ("partition_id", "partition-id()", "", None),
    ("replica_id", "replica-id()", "", None),
    ("domain", 'domain(a), domain={kind="sharding", entry={maximal device=0}, exit={maximal device=1}}', "", None),
    ("reduce", "reduce(a, z), dimensions={1}, to_apply=%add", "", None),
    ("reduce_all", "reduce(a, z), dimensions={0,1}, to_apply=%add", "", None),
    ("reduce_none", "reduce(a, z), dimensions={}, to_apply=%add", "", None),
    ("reduce_bf16_input", "reduce(h, z), dimensions={0}, to_apply=%add", "", None),
    ("reduce_variadic", "reduce(a, i, z, zi), dimensions={1}, to_apply=%argmax", ARGMAX,
     PARAMS + "  zi = s32[] constant(0)\n"),
    ("reduce_window", "reduce-window(a, z), window={size=2x3 stride=2x1 pad=0_1x1_1}, to_apply=%add", "", None),
    ("reduce_window_dilated", "reduce-window(a, z), window={size=2x2 stride=1x3 lhs_dilate=2x1 rhs_dilate=1x2}, to_apply=%add", "", None),
    ("select_and_scatter", "select-and-scatter(a, src, z), window={size=2x1 stride=2x1}, select=%ge, scatter=%add", GE,
     PARAMS + "  src = f32[2,8] parameter(15)\n"),
    ("sort", "sort(a), dimensions={1}, to_apply=%less", LESS, None),
    ("sort_pair", "sort(a, i), dimensions={1}, to_apply=%less2",
     "%less2 {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n  i = s32[] parameter(2)\n  j = s32[] parameter(3)\n  ROOT c = pred[] compare(x, y), direction=LT\n}\n", None),
    ("map", "map(a, b), dimensions={0,1}, to_apply=%add", "", None),
    ("topk", "topk(a), k=3", "", None),
    ("broadcast_scalar", "broadcast(s)", "", None),
    ("concatenate", "concatenate(a, col, b), dimensions={1}", "", None),
    ("concatenate_bounded", "concatenate(d, a), dimensions={1}", "", None),
    ("transpose_permutes_layout", "transpose(a), dimensions={1,0}", "", None),
    ("transpose_of_layout", "transpose(l), dimensions={1,0}", "", None),
    ("reverse", "reverse(a), dimensions={0,1}", "", None),
    ("pad", "pad(a, z), padding=1_2x0_0_3", "", None),
    ("pad_negative", "pad(a, z), padding=-1_-2x0_0", "", None),
    ("get_dimension_size", "get-dimension-size(a), dimensions={1}", "", None),
    ("set_dimension_size", "set-dimension-size(a, k), dimensions={1}", "", None),
    ("dot", "dot(a, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}", "", PARAMS + "  w = f32[8,16] parameter(15)\n"),
    ("dot_batch", "dot(x, y), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={1}", "",
     "  x = f32[2,4,8] parameter(0)\n  y = f32[2,8,16] parameter(1)\n"),
    ("dot_mixed_types", "dot(x, y), lhs_contracting_dims={1}, rhs_contracting_dims={0}", "",
     "  x = s8[4,8] parameter(0)\n  y = s32[8,16] parameter(1)\n"),
    ("dot_outer", "dot(a, w)", "", PARAMS + "  w = f32[8,16] parameter(15)\n"),
    ("ragged_dot", "ragged-dot(x, y, g), lhs_contracting_dims={1}, rhs_contracting_dims={1}, lhs_ragged_dims={0}, rhs_group_dims={0}", "",
     "  x = f32[16,8] parameter(0)\n  y = f32[4,8,32] parameter(1)\n  g = s32[4] parameter(2)\n"),
    ("scaled_dot", "scaled-dot(x, y, xs, ys), lhs_contracting_dims={1}, rhs_contracting_dims={0}", "",
     "  x = bf16[16,32] parameter(0)\n  y = bf16[32,8] parameter(1)\n  xs = bf16[32,4] parameter(2)\n  ys = bf16[1,8] parameter(3)\n"),
    ("convolution", "convolution(x, w), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f", "",
     "  x = f32[2,10,10,3] parameter(0)\n  w = f32[3,3,3,8] parameter(1)\n"),
    ("convolution_strided", "convolution(x, w), window={size=3x2 stride=2x3 rhs_dilate=1x2}, dim_labels=bf01_oi01->f01b", "",
     "  x = f32[2,3,11,13] parameter(0)\n  w = f32[8,3,3,2] parameter(1)\n"),
    ("convolution_grouped", "convolution(x, w), window={size=1}, dim_labels=b0f_0io->b0f, feature_group_count=2", "",
     "  x = f32[2,5,6] parameter(0)\n  w = f32[1,3,4] parameter(1)\n"),
    ("fft", "fft(c), fft_type=FFT, fft_length={8}", "", None),
    ("rfft", "fft(a), fft_type=RFFT, fft_length={8}", "", None),
    ("irfft", "fft(x), fft_type=IRFFT, fft_length={4,14}", "", "  x = c64[3,4,8] parameter(0)\n"),
    ("triangular_solve", "triangular-solve(x, y), left_side=true, lower=true, transpose_a=NO_TRANSPOSE", "",
     "  x = f32[4,4] parameter(0)\n  y = f32[4,3] parameter(1)\n"),
    ("cholesky", "cholesky(x), lower=true", "", "  x = f32[2,4,4] parameter(0)\n"),
    ("batch_norm_training", "batch-norm-training(x, f, f), epsilon=0.001, feature_index=1", "",
     "  x = f32[2,4,6] parameter(0)\n  f = f32[4] parameter(1)\n"),
    ("batch_norm_inference", "batch-norm-inference(x, f, f, f, f), epsilon=0.001, feature_index=2", "",
     "  x = f32[2,4,6] parameter(0)\n  f = f32[6] parameter(1)\n"),
    ("batch_norm_grad", "batch-norm-grad(x, f, f, f, x), epsilon=0.001, feature_index=0", "",
     "  x = f32[2,4,6] parameter(0)\n  f = f32[2] parameter(1)\n"),
    ("gather", "gather(o, n), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,4}", "",
     "  o = f32[8,4] parameter(0)\n  n = s32[3,1] parameter(1)\n"),
    ("gather_implicit_vector", "gather(o, n), offset_dims={0,1}, collapsed_slice_dims={}, start_index_map={0}, index_vector_dim=1, slice_sizes={2,4}", "",
     "  o = f32[8,4] parameter(0)\n  n = s32[3] parameter(1)\n"),
    ("gather_batching", "gather(o, n), offset_dims={2}, collapsed_slice_dims={1}, start_index_map={1}, operand_batching_dims={0}, "
     "start_indices_batching_dims={0}, index_vector_dim=2, slice_sizes={1,1,5}", "",
     "  o = f32[2,8,5] parameter(0)\n  n = s32[2,3,1] parameter(1)\n"),
    ("scatter", "scatter(o, n, v), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add", "",
     "  o = f32[8,4] parameter(0)\n  n = s32[3,1] parameter(1)\n  v = f32[3,4] parameter(2)\n"),
    ("scatter_variadic", "scatter(o, q, n, v, w), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, "
     "index_vector_dim=1, to_apply=%argmax", ARGMAX,
     "  o = f32[8,4] parameter(0)\n  q = s32[8,4] parameter(1)\n  n = s32[3,1] parameter(2)\n  v = f32[3,4] parameter(3)\n  w = s32[3,4] parameter(4)\n"),
]  # fmt: skip

# XLA's parser infers these, and its verifier then refuses them: implicit broadcast in an elementwise op,
# and `dimensions=` read as new dim sizes by inference but as the operand's dims by the verifier. We
# refuse them at parse time (the verifier's check); the shape we infer is still XLA's.
# (id, opcode, operands, attributes as written, the same typed)
INFERRED_THEN_REFUSED = [
    ("add_scalar", "add", ("s", "a"), "", ()),
    ("add_degenerate", "add", ("col", "row"), "", ()),
    ("compare_scalar", "compare", ("s", "a"), "direction=EQ", ()),
    ("broadcast_sizes", "broadcast", ("a",), "dimensions={3,2}", (Attribute("dimensions", (3, 2), "{3,2}"),)),
]

# (id, root instruction, computations, parameters): XLA would infer the opcode, but these operands do not fit.
NOT_INFERRED = [
    ("add_dims", "add(a, col2)", "", PARAMS + "  col2 = f32[4,9] parameter(15)\n"),
    ("add_types", "add(a, i)", "", None),
    ("add_ranks", "add(a, v)", "", PARAMS + "  v = f32[8] parameter(15)\n"),
    ("and_float", "and(a, b)", "", None),
    ("subtract_pred", "subtract(m, m)", "", None),
    ("floor_int", "floor(i)", "", None),
    ("abs_unsigned", "abs(u)", "", None),
    ("opt_barrier", "opt-barrier(t)", "", None),
    ("select_not_pred", "select(i, a, b)", "", None),
    ("get_tuple_element_range", "get-tuple-element(t), index=2", "", None),
    ("get_tuple_element_array", "get-tuple-element(a), index=0", "", None),
    ("while_shapes", "while(a), condition=%cond, body=%body", LOOP, None),
    ("call_arity", "call(a), to_apply=%add", "", None),
    ("reduce_duplicate_dims", "reduce(a, z), dimensions={1,1}, to_apply=%add", "", None),
    ("reduce_out_of_range", "reduce(a, z), dimensions={2}, to_apply=%add", "", None),
    ("reduce_window_no_window", "reduce-window(a, z), to_apply=%add", "", None),
    ("map_without_dims", "map(a, b), to_apply=%add", "", None),
    ("transpose_not_permutation", "transpose(a), dimensions={0,0}", "", None),
    ("concatenate_dims", "concatenate(a, x), dimensions={1}", "", PARAMS + "  x = f32[5,8] parameter(15)\n"),
    ("dot_contracting", "dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}", "", None),
    ("gather_slice_sizes", "gather(o, n), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,5}", "",
     "  o = f32[8,4] parameter(0)\n  n = s32[3,1] parameter(1)\n"),
    ("pad_value_not_scalar", "pad(a, b), padding=0_0x0_0", "", None),
]  # fmt: skip

# Opcodes XLA never infers: the shape must be written.
NEEDS_SHAPE = [
    ("convert", "convert(a)"),
    ("bitcast_convert", "bitcast-convert(a)"),
    ("reshape", "reshape(a)"),
    ("slice", "slice(a), slice={[0:2], [0:8]}"),
    ("dynamic_slice", "dynamic-slice(a, k, k), dynamic_slice_sizes={2,2}"),
    ("iota", "iota(), iota_dimension=0"),
    ("all_reduce", "all-reduce(a), to_apply=%add"),
    ("custom_call", 'custom-call(a), custom_call_target="foo"'),
    ("bitcast", "bitcast(a)"),
    ("reduce_precision", "reduce-precision(a), exponent_bits=5, mantissa_bits=10"),
]


def _case_text(case: tuple) -> str:
    _, root, computations, params = case
    return module(root, computations, params or PARAMS)


def _root_shape_as_printed(printed: str) -> str:
    """`ROOT %result = <shape> <opcode>(...)` in XLA's printout -> the shape text."""
    line = next(line for line in printed.splitlines() if "%result = " in line)
    rhs = line.split("%result = ", 1)[1]
    return rhs[: re.search(r" [a-z][a-z0-9\-]*\(", rhs).start()]  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def xla() -> Iterator[XlaParser]:
    with XlaParser() as parser:
        yield parser


@pytest.mark.parametrize("case", INFERRED, ids=[c[0] for c in INFERRED])
def test_inferred_shape_parses(case: tuple) -> None:
    parse_hlo(_case_text(case))


@pytest.mark.xla
@pytest.mark.parametrize("case", INFERRED, ids=[c[0] for c in INFERRED])
def test_inferred_shape_is_xlas(case: tuple, xla: XlaParser) -> None:
    text = _case_text(case)
    verdict = xla.parse(text)
    assert verdict.accepted, verdict.error
    ours = parse_hlo(text).entry.root.shape.to_text()
    assert ours == _root_shape_as_printed(verdict.text)


def _refused_text(case: tuple) -> str:
    _, opcode, operands, attributes, _ = case
    return module(f"{opcode}({', '.join(operands)})" + (f", {attributes}" if attributes else ""))


@pytest.mark.parametrize("case", INFERRED_THEN_REFUSED, ids=[c[0] for c in INFERRED_THEN_REFUSED])
def test_inferred_then_refused_as_xlas_verifier_does(case: tuple) -> None:
    with pytest.raises(HloParseError) as info:
        parse_hlo(_refused_text(case))
    assert info.value.message.startswith("'result': ")
    assert info.value.line == _refused_text(case).count("\n") - 1


@pytest.mark.xla
@pytest.mark.parametrize("case", INFERRED_THEN_REFUSED, ids=[c[0] for c in INFERRED_THEN_REFUSED])
def test_inferred_then_refused_shape_is_xlas(case: tuple, xla: XlaParser) -> None:
    _, opcode, operands, _, typed = case
    verdict = xla.parse(_refused_text(case))
    assert verdict.accepted, verdict.error
    entry = parse_hlo(module(f"tuple({', '.join(operands)})")).entry
    # The add computation holds an `s` too: XLA's parser, and ours, name the entry's `s.1`.
    shapes = [entry[o if o in entry else f"{o}.1"].shape for o in operands]
    ours = infer_shape(opcode, shapes, typed, program_shape=lambda name: ((), entry.root.shape))
    assert ours is not None and ours.to_text() == _root_shape_as_printed(verdict.text)


@pytest.mark.parametrize("case", NOT_INFERRED, ids=[c[0] for c in NOT_INFERRED])
def test_failed_inference_is_located(case: tuple) -> None:
    text = _case_text(case)
    with pytest.raises(HloParseError) as info:
        parse_hlo(text)
    error = info.value
    assert error.message.startswith(f"cannot infer the shape of this {case[1].split('(')[0]}: "), error
    assert text.splitlines()[error.line - 1].startswith("  ROOT result = ")


@pytest.mark.xla
@pytest.mark.parametrize("case", NOT_INFERRED, ids=[c[0] for c in NOT_INFERRED])
def test_xla_fails_to_infer_too(case: tuple, xla: XlaParser) -> None:
    verdict = xla.parse(_case_text(case))
    assert not verdict.accepted
    assert "failed to infer shape for opcode" in verdict.error or verdict.crashed, verdict.error


@pytest.mark.parametrize("root", [c[1] for c in NEEDS_SHAPE], ids=[c[0] for c in NEEDS_SHAPE])
def test_shape_must_be_written(root: str) -> None:
    with pytest.raises(HloParseError, match="write its shape before the opcode") as info:
        parse_hlo(module(root))
    assert (info.value.line, info.value.column) == (module(root).count("\n") - 1, len("  ROOT result = ") + 1)


@pytest.mark.xla
@pytest.mark.parametrize("root", [c[1] for c in NEEDS_SHAPE], ids=[c[0] for c in NEEDS_SHAPE])
def test_xla_needs_the_shape_too(root: str, xla: XlaParser) -> None:
    verdict = xla.parse(module(root))
    assert not verdict.accepted and "cannot infer shape for opcode" in verdict.error, verdict.error


def test_while_in_xlas_test_style() -> None:
    """hlo_parser_test.cc writes `%while = while(%init), condition=%cond, body=%body` with no shape."""
    text = module("while(%init), condition=%cond, body=%body", LOOP,
                  "  v = f32[4] parameter(0)\n  zero = s32[] constant(0)\n  %init = (f32[4], s32[]) tuple(v, zero)\n")  # fmt: skip
    loop = parse_hlo(text).entry.root
    assert loop.opcode == "while" and loop.shape.to_text() == "(f32[4]{0}, s32[])"


def test_callee_must_come_first() -> None:
    text = (
        "HloModule m\n\nENTRY %e {\n  x = f32[] parameter(0)\n  ROOT r = call(x), to_apply=%later\n}\n\n"
        + NEG.replace("%neg", "%later")
    )
    with pytest.raises(HloParseError, match="computation 'later' is not defined before its use"):
        parse_hlo(text)

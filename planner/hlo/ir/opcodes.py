"""The HLO opcodes XLA's parser knows, and the operand counts it checks.

The table mirrors `HLO_OPCODE_LIST` in XLA's `hlo_opcode.h` as jaxlib 0.7.1
builds it (name, arity; -1 for variadic), with the counts its parser really
checks: `dot` is variadic there, and the parser reads `ragged-all-to-all`
with any number of operands (tests/test_parse_differential.py holds the
table to that parser). A misspelt opcode or a binary op
with one operand is a parse error with a location, as it is in XLA's own
parser, rather than a surprise later in propagation. An opcode in this table
that propagation has no rule for still parses: propagation leaves it unknown
and says why.
"""

from __future__ import annotations

_VARIADIC = -1

# fmt: off
OPCODE_ARITY: dict[str, int] = {
    "abs": 1, "add": 2, "add-dependency": 2, "after-all": _VARIADIC, "all-gather": _VARIADIC,
    "all-gather-done": 1, "all-gather-start": _VARIADIC, "all-reduce": _VARIADIC, "all-reduce-done": 1,
    "all-reduce-start": _VARIADIC, "all-to-all": _VARIADIC, "and": 2, "async-done": 1,
    "async-start": _VARIADIC, "async-update": 1, "atan2": 2, "batch-norm-grad": 5,
    "batch-norm-inference": 5, "batch-norm-training": 3, "bitcast": 1, "bitcast-convert": 1,
    "broadcast": 1, "call": _VARIADIC, "cbrt": 1, "ceil": 1, "cholesky": 1, "clamp": 3,
    "count-leading-zeros": 1, "collective-broadcast": _VARIADIC, "collective-permute": _VARIADIC,
    "collective-permute-done": 1, "collective-permute-start": _VARIADIC, "compare": 2, "complex": 2,
    "concatenate": _VARIADIC, "conditional": _VARIADIC, "constant": 0, "convert": 1, "convolution": 2,
    "copy": 1, "copy-done": 1, "copy-start": 1, "cosine": 1, "custom-call": _VARIADIC, "divide": 2,
    "domain": 1, "dot": _VARIADIC, "dynamic-reshape": _VARIADIC, "dynamic-slice": _VARIADIC,
    "dynamic-update-slice": _VARIADIC, "erf": 1, "exponential": 1, "exponential-minus-one": 1, "fft": 1,
    "floor": 1, "fusion": _VARIADIC, "gather": 2, "get-dimension-size": 1, "get-tuple-element": 1,
    "imag": 1, "infeed": 1, "iota": 0, "is-finite": 1, "log": 1, "log-plus-one": 1, "logistic": 1,
    "map": _VARIADIC, "maximum": 2, "minimum": 2, "multiply": 2, "negate": 1, "not": 1,
    "opt-barrier": 1, "or": 2, "outfeed": 2, "pad": 2, "parameter": 0, "partition-id": 0, "popcnt": 1,
    "power": 2, "ragged-all-to-all": _VARIADIC, "ragged-dot": 3, "real": 1, "recv": 1, "recv-done": 1,
    "reduce": _VARIADIC, "reduce-precision": 1, "reduce-scatter": _VARIADIC, "reduce-window": _VARIADIC,
    "remainder": 2, "replica-id": 0, "reshape": 1, "reverse": 1, "rng": _VARIADIC,
    "rng-bit-generator": 1, "rng-get-and-update-state": 0, "round-nearest-afz": 1,
    "round-nearest-even": 1, "rsqrt": 1, "scaled-dot": 4, "scatter": _VARIADIC, "select": 3,
    "select-and-scatter": 3, "send": 2, "send-done": 1, "set-dimension-size": 2, "shift-left": 2,
    "shift-right-arithmetic": 2, "shift-right-logical": 2, "sign": 1, "sine": 1, "slice": 1,
    "sort": _VARIADIC, "sqrt": 1, "stochastic-convert": 2, "subtract": 2, "tan": 1, "tanh": 1,
    "topk": 1, "transpose": 1, "triangular-solve": 2, "tuple": _VARIADIC, "while": 1, "xor": 2,
}
# fmt: on
OPCODES = frozenset(OPCODE_ARITY)

# Elementwise ops (HloInstruction::IsElementwise), by operand count.
UNARY_ELEMENTWISE = frozenset(
    """abs bitcast-convert cbrt ceil count-leading-zeros convert copy cosine erf exponential
    exponential-minus-one floor imag is-finite log log-plus-one logistic negate not popcnt real
    reduce-precision round-nearest-afz round-nearest-even rsqrt sign sine sqrt tan tanh""".split()
)
BINARY_ELEMENTWISE = frozenset(
    """add and atan2 complex compare divide maximum minimum multiply or power remainder shift-left
    shift-right-arithmetic shift-right-logical stochastic-convert subtract xor""".split()
)
TERNARY_ELEMENTWISE = frozenset({"select", "clamp"})
ELEMENTWISE = UNARY_ELEMENTWISE | BINARY_ELEMENTWISE | TERNARY_ELEMENTWISE
assert ELEMENTWISE <= OPCODES

# (min, max) operands the parser checks; max None means unbounded. Fixed-arity
# opcodes take exactly their arity; these variadic ones have bounds of their own.
ARITY: dict[str, tuple[int, int | None]] = {
    **{op: (n, n) for op, n in OPCODE_ARITY.items() if n != _VARIADIC},
    "dynamic-slice": (2, None),
    "dynamic-update-slice": (3, None),
    "reduce": (2, None),
    "reduce-window": (2, None),
    "concatenate": (1, None),
    # Variadic in XLA's table (sparse dots carry metadata operands); XLA's parser needs lhs and rhs.
    "dot": (2, None),
}


def arity_problem(opcode: str, count: int) -> str | None:
    """A message when `count` operands are wrong for `opcode`, else None."""
    bounds = ARITY.get(opcode)
    if bounds is None:
        return None
    low, high = bounds
    if count < low or (high is not None and count > high):
        want = str(low) if low == high else f"at least {low}" if high is None else f"{low} to {high}"
        return f"{opcode} takes {want} operand{'s' if want != '1' else ''}, got {count}"
    if opcode in ("reduce", "reduce-window") and count % 2:
        return f"{opcode} takes operands and init values in pairs, got {count} operands"
    return None

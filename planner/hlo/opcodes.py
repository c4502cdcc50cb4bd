"""The HLO opcodes XLA defines, and the operand counts the parser checks.

A misspelt opcode or a binary op with one operand is a parse error with a
location, as it is in XLA's own parser, rather than a surprise later in
propagation.
"""

from __future__ import annotations

UNARY_ELEMENTWISE = frozenset(
    """abs bitcast-convert cbrt ceil clz convert copy cosine erf exponential exponential-minus-one floor imag
    is-finite log log-plus-one logistic negate not popcnt real reduce-precision round-nearest-afz
    round-nearest-even rsqrt sign sine sqrt stochastic-convert tan tanh""".split()
)
BINARY_ELEMENTWISE = frozenset(
    """add and atan2 complex compare divide maximum minimum multiply or power remainder shift-left
    shift-right-arithmetic shift-right-logical subtract xor""".split()
)
TERNARY_ELEMENTWISE = frozenset({"select", "clamp"})

_OTHER = """add-dependency after-all all-gather all-gather-done all-gather-start all-reduce all-reduce-done
    all-reduce-start all-to-all async-done async-start async-update batch-norm-grad batch-norm-inference
    batch-norm-training bitcast broadcast call cholesky collective-broadcast collective-permute
    collective-permute-done collective-permute-start concatenate conditional constant convolution copy-done
    copy-start custom-call domain dot dynamic-reshape dynamic-slice dynamic-update-slice fft fusion gather
    get-dimension-size get-tuple-element infeed iota map optimization-barrier outfeed pad parameter
    partition-id ragged-all-to-all ragged-dot recv recv-done reduce reduce-scatter reduce-window replica-id
    reshape reverse rng rng-bit-generator rng-get-and-update-state scatter select-and-scatter send send-done
    set-dimension-size slice sort topk transpose triangular-solve tuple while""".split()

OPCODES = UNARY_ELEMENTWISE | BINARY_ELEMENTWISE | TERNARY_ELEMENTWISE | frozenset(_OTHER)

# (min, max) operands; max None means unbounded. Opcodes not listed are not checked.
ARITY: dict[str, tuple[int, int | None]] = {
    **{op: (1, 1) for op in UNARY_ELEMENTWISE},
    **{op: (2, 2) for op in BINARY_ELEMENTWISE},
    **{op: (3, 3) for op in TERNARY_ELEMENTWISE},
    "parameter": (0, 0),
    "constant": (0, 0),
    "iota": (0, 0),
    "partition-id": (0, 0),
    "replica-id": (0, 0),
    "get-tuple-element": (1, 1),
    "reshape": (1, 1),
    "transpose": (1, 1),
    "broadcast": (1, 1),
    "slice": (1, 1),
    "reverse": (1, 1),
    "bitcast": (1, 1),
    "while": (1, 1),
    "pad": (2, 2),
    "dot": (2, 2),
    "convolution": (2, 2),
    "dynamic-slice": (2, None),
    "dynamic-update-slice": (3, None),
    "gather": (2, 2),
    "reduce": (2, None),
    "reduce-window": (2, None),
    "concatenate": (1, None),
    "rng-bit-generator": (1, 1),
    "get-dimension-size": (1, 1),
    "set-dimension-size": (2, 2),
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
    if opcode == "reduce" and count % 2:
        return f"reduce takes operands and init values in pairs, got {count} operands"
    return None

"""Shardy's kinds of op, by HLO opcode: the one table the Shardy engine and the round trip read.

Shardy asks an op what it is through MLIR traits (`isElementwise`, `isConstantPreserving`) and gives
rules by op (`op_sharding_rule_registry.cc`). An HLO module reaches Shardy through XLA's conversion to
StableHLO, where an HLO opcode StableHLO lacks becomes a custom call (`stochastic-convert`, `erf`,
`topk`): such an opcode is of no kind here, whatever HLO calls it. A release that changes a kind changes
it here, once, for the driver, the import's constant splitting, the round trip and the registry alike.
"""

from __future__ import annotations

from planner.hlo.ir.opcodes import BINARY_ELEMENTWISE, ELEMENTWISE, UNARY_ELEMENTWISE

# HLO opcodes that are no StableHLO op: XLA's import writes them as custom calls.
_NO_STABLEHLO_OP = frozenset({"stochastic-convert"})

# `isElementwise`: ops of StableHLO's Elementwise trait (the op-priority schedule's first step, the
# aggressive strategy's tie-break).
SHARDY_ELEMENTWISE = ELEMENTWISE - _NO_STABLEHLO_OP

# Ops that only move or reshape data: with elementwise ones, they keep a constant a constant.
SHAPE_OPS = frozenset({"broadcast", "reshape", "slice"})

# `isConstantPreserving`: an op of these whose operands are all constant expressions is one itself, which
# the import's splitter copies per use (`constant_or_scalar_splitter.cc`).
CONSTANT_PRESERVING = SHARDY_ELEMENTWISE | SHAPE_OPS

# Collectives that keep their operands' shapes: pointwise in Shardy's registry.
SHAPE_KEEPING_COLLECTIVES = frozenset({"all-reduce", "collective-broadcast", "collective-permute"})

# The registry's pointwise entries: unary and binary elementwise ops and the collectives above, less
# bitcast-convert (a rule of its own: it may change the minor dim) and copy (XLA imports it as
# `mhlo.copy`, whose rule is XLA's own extension). `erf` and `topk` reach Shardy as `custom_call @mhlo.erf`
# / `@mhlo.topk`; select and clamp have rules of their own (scalar operands).
POINTWISE = (
    (UNARY_ELEMENTWISE | BINARY_ELEMENTWISE | SHAPE_KEEPING_COLLECTIVES)
    - _NO_STABLEHLO_OP
    - {
        "bitcast-convert",
        "copy",
    }
)

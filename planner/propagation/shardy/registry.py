"""Shardy's per-op sharding rule registry, over HLO: which factors each op's dims are made of.

Shardy propagates through an op only by its rule (`rule.py`): one `switch` over ops in
`op_sharding_rule_registry.cc` builds it from the op's shapes and attributes, a few builder calls per
op. This is that switch, keyed by HLO opcode; StableHLO ops reach us as jaxlib converts them
(`stablehlo.dot_general` is a `dot`, `broadcast_in_dim` a `broadcast`, `custom_call @foo` a
`custom-call` with `custom_call_target="foo"`). The entries live by kind in `registry_shapes`,
`registry_reductions`, `registry_data` and `registry_custom`, each adding factors in the order its C++
case does: aggressive propagation breaks ties by factor index, so the order is part of the rule.

Worked example: `dot(f32[4,8,32] lhs, f32[4,32,16] rhs), lhs_batch_dims={0}, rhs_batch_dims={0},
lhs_contracting_dims={2}, rhs_contracting_dims={1}` -> `f32[4,8,16]`. The batch pair comes first (i=4,
lhs 0, rhs 0, result 0), then lhs's free dim (j=8, result 1), rhs's (k=16, result 2), and last the
contracting pair, a reduction no result holds (l=32):
`#sdy.op_sharding_rule<([i, j, l], [i, l, k])->([i, j, k]) {i=4, j=8, k=16, l=32} reduction={l}>`.

Shardy's registry changes between releases, and JAX users meet the one inside their jaxlib: each call
names the release it asks (`release.ShardyRelease`, the installed jaxlib's by default), and the entries
whose rule changed read how from the release's traits.

An op with no rule blocks propagation, as in Shardy: constants, iota and parameters (nothing flows in),
tuples, get-tuple-element, while, conditional, call and optimization barriers (data-flow edges,
which the driver follows itself), and every opcode and custom call Shardy does not know (`no_rule_reason`
says which and why). A rule an op carries with it (`xla.sdy.sharding_rule`) comes first.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.hlo.ir.frontend_attributes import FrontendAttributes
from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.hlo.ir.shardy_op_kinds import POINTWISE
from planner.propagation.shardy import registry_custom as custom
from planner.propagation.shardy import registry_data as data
from planner.propagation.shardy import registry_reductions as reductions
from planner.propagation.shardy import registry_shapes as shapes
from planner.propagation.shardy import registry_xla as xla
from planner.propagation.shardy.registry_common import OpView, RuleFn, pointwise
from planner.propagation.shardy.registry_rule_text import parse_rule
from planner.propagation.shardy.release import ShardyRelease
from planner.propagation.shardy.rule import OpShardingRule
from planner.sharding.shardy import ShardyTextError

# The frontend attribute holding a rule an op brings along (Shardy's `sdy.sharding_rule`).
SHARDING_RULE = "xla.sdy.sharding_rule"

_RULES: dict[str, RuleFn] = {
    **dict.fromkeys(POINTWISE, pointwise),
    "all-gather": reductions.all_gather,
    "all-to-all": reductions.all_to_all,
    "batch-norm-inference": reductions.batch_norm_inference,
    "copy": xla.copy,
    "ragged-dot": xla.ragged_dot,
    "bitcast-convert": shapes.bitcast_convert,
    "broadcast": shapes.broadcast,
    "cholesky": data.cholesky,
    "clamp": shapes.clamp,
    "concatenate": shapes.concatenate,
    "convolution": reductions.convolution,
    "custom-call": custom.custom_call,
    "dot": reductions.dot,
    "dynamic-slice": shapes.dynamic_slice,
    "dynamic-update-slice": shapes.dynamic_update_slice,
    "fft": data.fft,
    "gather": data.gather,
    "pad": shapes.pad,
    "reduce": reductions.reduce,
    "reduce-scatter": reductions.reduce_scatter,
    "reduce-window": reductions.reduce_window,
    "reshape": shapes.reshape,
    "reverse": shapes.reverse,
    "rng-bit-generator": data.rng_bit_generator,
    "scatter": data.scatter,
    "select": shapes.select,
    "select-and-scatter": reductions.select_and_scatter,
    "slice": shapes.slice_,
    "sort": data.sort,
    "topk": data.top_k,
    "transpose": shapes.transpose,
    "triangular-solve": data.triangular_solve,
}

# Opcodes Shardy names only to give them no rule, and why.
_NO_RULE = {
    **dict.fromkeys(("constant", "iota", "parameter", "partition-id", "replica-id"), "nothing propagates into it"),
    **dict.fromkeys(
        ("tuple", "get-tuple-element", "while", "conditional", "call", "opt-barrier"),
        "a data-flow edge: its values pass through unchanged, which the driver follows itself",
    ),
    **dict.fromkeys(("after-all", "infeed", "outfeed", "send", "recv"), "a token or host transfer"),
}


def sharding_rule(
    inst: Instruction,
    operand_shapes: Sequence[ArrayShape],
    result_shapes: Sequence[ArrayShape],
    *,
    conservative: bool = False,
    computation: Computation | None = None,
    module: HloModule | None = None,
    release: ShardyRelease | None = None,
) -> OpShardingRule | None:
    """The rule of `inst`, or None when it has none (Shardy: propagation stops at the op).

    `operand_shapes` are its operands' array shapes, `result_shapes` the array leaves of its result.
    `conservative` is Shardy's `conservativePropagation`: no propagation along a sliced, padded,
    concatenated, windowed or convolved spatial dim. `computation`, the one holding `inst`, lets the two
    rules that look at neighbouring ops see them (concatenate of slices, X64Combine read by a
    rng-bit-generator); without it they take the answer that propagates less. `module`, the one holding
    `inst`, lets a scatter read its update computation. `release` is the Shardy whose rule is asked (that
    of the jaxlib that compiles the module); None: the installed jaxlib's, or the newest without one.
    """
    attached = _attached_rule(inst)
    if attached is not None:
        return attached
    release = ShardyRelease.installed() if release is None else release
    rule = _RULES.get(inst.opcode)
    if rule is None or inst.opcode in release.traits.unknown_opcodes:
        return None
    operands = tuple(s.dims for s in operand_shapes)
    results = tuple(s.dims for s in result_shapes)
    if any(d < 0 for dims in (*operands, *results) for d in dims):
        return None  # an unbounded dynamic dim: Shardy rules are over static sizes
    return rule(OpView(inst, operands, results, conservative, computation, release, module))


def no_rule_reason(inst: Instruction, release: ShardyRelease | None = None) -> str | None:
    """Why `inst` has no rule in `release` (None: the installed jaxlib's), for a message; None when Shardy has
    an entry for it (which may still find no rule for these shapes: a reshape of zero elements, a tuple
    all-to-all)."""
    release = ShardyRelease.installed() if release is None else release
    if inst.opcode in _NO_RULE:
        return f"{inst.opcode} has no sharding rule: {_NO_RULE[inst.opcode]}"
    if _attached_rule(inst) is not None:
        return None
    if inst.opcode == "custom-call":
        return custom.no_rule_reason(inst.attr("custom_call_target"), release)
    if inst.opcode in release.traits.unknown_opcodes:
        return f"{inst.opcode} is unknown to {release.shardy}'s sharding rule registry"
    if inst.opcode not in _RULES:
        return f"{inst.opcode} is unknown to Shardy's sharding rule registry"
    return None


def _attached_rule(inst: Instruction) -> OpShardingRule | None:
    attributes = inst.attr("frontend_attributes")
    if not isinstance(attributes, FrontendAttributes):
        return None
    text = attributes.get(SHARDING_RULE)
    if text is None:
        return None
    try:
        return parse_rule(text)
    except ShardyTextError as e:
        raise ShardyTextError(f"{inst.name}: bad {SHARDING_RULE}: {e}", e.offset) from None

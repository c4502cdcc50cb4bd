"""What every forward rule shares: the operand an op takes its sharding from, and how improvements are offered."""

from __future__ import annotations

from collections.abc import Callable

from planner.propagation.gspmd.context import Context, is_passthrough_custom_call
from planner.propagation.shared.graph import Node
from planner.sharding.hlo_sharding import HloSharding
from planner.sharding.merge import is_more_specific, is_spatially_partitioned

# A forward rule: improves the node from its operands, True when its sharding changed.
Rule = Callable[[Context, Node], bool]

# PickRepresentativeOperand: ops that take operand 0, and ops that take the most specific operand.
FIRST_OPERAND = frozenset(
    "map pad power opt-barrier reverse slice shift-left shift-right-arithmetic shift-right-logical".split()
)


MOST_SPECIFIC = frozenset(
    """abs add and atan2 bitcast-convert ceil clamp count-leading-zeros compare complex concatenate convert copy cosine
    all-gather all-reduce reduce-scatter all-to-all collective-broadcast collective-permute divide erf exponential
    exponential-minus-one floor imag is-finite log log-plus-one logistic maximum minimum multiply negate not or
    popcnt real reduce-precision remainder round-nearest-afz round-nearest-even rsqrt select sign sine sort sqrt
    cbrt subtract stochastic-convert tan tanh topk while xor""".split()
)


def pick_representative_operand(node: Node) -> Node | None:
    if node.opcode in FIRST_OPERAND:
        return node.operands[0] if node.operands and node.operands[0].sharding is not None else None
    if node.opcode == "custom-call":
        if is_passthrough_custom_call(node):
            return node.operands[0] if node.operands[0].sharding is not None else None
        return None
    if node.opcode not in MOST_SPECIFIC:
        return None
    best: Node | None = None
    for operand in node.operands:
        if operand.sharding is None:
            continue
        if best is None or (
            operand.sharding.is_tuple == best.sharding.is_tuple  # type: ignore[union-attr]
            and is_more_specific(operand.sharding, best.sharding)  # type: ignore[arg-type]
        ):
            best = operand
    return best


def partitioned(node: Node) -> bool:
    return node.sharding is not None and is_spatially_partitioned(node.sharding)


def may_reshard(ctx: Context, node: Node) -> bool:
    """One non-root user: the node may take a sharding that is not a refinement of its own (XLA's aggressive mode)."""
    return ctx.non_root_users(node) == 1


def improve_element(
    ctx: Context, node: Node, s: HloSharding, index: int, rule: str, sources: tuple[Node, ...], aggressive: bool = False
) -> bool:
    """MaybeImproveInstructionSubSharding: improve one output of a multi-output op."""
    if node.is_array:
        return ctx.improve(node, s, rule, sources, aggressive)
    from planner.hlo.ir.shapes import TupleShape
    from planner.sharding.merge import improved_sharding

    assert isinstance(node.shape, TupleShape)
    leaf = node.shape.elements[index]
    current = node.sharding
    existing = current.elements[index] if current is not None and current.is_tuple else current
    dims = leaf.dims if hasattr(leaf, "dims") else None
    result = improved_sharding(s, existing, dims, ctx.combine_partial, aggressive)
    if result is None:
        return False
    count = len(node.shape.elements)
    leaves = list(current.elements) if current is not None and current.is_tuple else [HloSharding.replicate()] * count
    leaves[index] = result
    ctx.set(node, HloSharding.tuple_of(tuple(leaves)), rule, sources)
    return True

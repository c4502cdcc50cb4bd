"""State shared by the propagation rules during one run.

`improve()` is XLA's MaybeImproveInstructionSharding with provenance: every
change of a node's sharding records the rule and the neighbours it came from.
"""

from __future__ import annotations

from planner.hlo.opcodes import BINARY_ELEMENTWISE, TERNARY_ELEMENTWISE, UNARY_ELEMENTWISE
from planner.hlo.shapes import ArrayShape
from planner.propagation.graph import Graph, Node, Provenance
from planner.propagation.options import PropagationOptions
from planner.sharding.hlo_sharding import HloSharding
from planner.sharding.merge import improved_sharding

ELEMENTWISE_EXTRA = frozenset({"rng"})
# Ops that pass shardings at every aggressiveness (CanPropagateThroughAtAggressiveLevel).
PASS_THROUGH = frozenset(
    """call concatenate copy dynamic-slice dynamic-update-slice get-tuple-element opt-barrier
    reshape tuple transpose while""".split()
)
# Ops SupportSpatialPartitioning accepts besides elementwise ones.
PARTITIONABLE = frozenset(
    """broadcast concatenate conditional constant convolution opt-barrier dot dynamic-slice
    dynamic-update-slice gather get-tuple-element infeed iota pad reduce-window reshape scatter
    select-and-scatter slice sort transpose tuple while reduce rng-bit-generator all-reduce reduce-scatter""".split()
)
PASSTHROUGH_CUSTOM_CALLS = frozenset({"Sharding", "X64Combine", "LayoutConstraint"})
# Custom-calls XLA partitions itself (registered partitioners).
SHARDABLE_CUSTOM_CALLS = PASSTHROUGH_CUSTOM_CALLS | {"ShardBarrierFrom", "ShardBarrierTo"}


_ELEMENTWISE = UNARY_ELEMENTWISE | BINARY_ELEMENTWISE | TERNARY_ELEMENTWISE | ELEMENTWISE_EXTRA


def is_elementwise(node: Node) -> bool:
    op = node.opcode
    if op == "bitcast-convert":
        src = node.operands[0].shape
        return (
            isinstance(src, ArrayShape)
            and isinstance(node.shape, ArrayShape)
            and (src.element_bits == node.shape.element_bits)
        )
    return op in _ELEMENTWISE


class Context:
    def __init__(self, graph: Graph, options: PropagationOptions) -> None:
        self.graph = graph
        self.options = options
        self.provided: set[int] = set()
        # computation -> the While/call/conditional node that calls it
        self.computation_map: dict[str, Node] = {}
        self.aggressiveness = 0
        self.iteration = 0
        # Partial annotations: id(node) -> dims the annotation leaves open.
        self.unspecified_dims: dict[int, tuple[int, ...]] = {}

    @property
    def combine_partial(self) -> bool:
        return self.options.is_spmd and self.aggressiveness > 0

    def is_provided(self, node: Node) -> bool:
        return id(node) in self.provided

    def non_root_users(self, node: Node) -> int:
        root = self.graph.root(node.computation)
        return len(node.users) - (1 if root in node.users else 0)

    def set(self, node: Node, sharding: HloSharding, rule: str, sources: tuple[Node, ...] = ()) -> None:
        node.sharding = sharding
        node.provenance = Provenance(rule, tuple(s.name for s in sources), self.aggressiveness, self.iteration)

    def improve(
        self, node: Node, candidate: HloSharding, rule: str, sources: tuple[Node, ...] = (), aggressive: bool = False
    ) -> bool:
        dims = node.dims if node.is_array else None
        result = improved_sharding(candidate, node.sharding, dims, self.combine_partial, aggressive)
        if result is None:
            return False
        self.set(node, result, rule, sources)
        return True

    def can_propagate_at_level(self, node: Node) -> bool:
        if is_elementwise(node) or node.is_custom_call("Sharding") or node.opcode in PASS_THROUGH:
            return True
        if node.opcode == "broadcast":
            return self.aggressiveness >= 2
        return self.aggressiveness >= 1

    def supports_spatial_partitioning(self, node: Node, allow_output: bool, allow_parameters: bool) -> bool:
        comp = node.computation
        root = self.graph.root(comp)
        if node is root and comp not in self.computation_map and not (comp == self.graph.entry and allow_output):
            return False
        if is_elementwise(node) and (node.opcode != "rng" or self.options.is_spmd):
            return True
        if node.opcode in PARTITIONABLE:
            return True
        if node.opcode == "parameter":
            return allow_parameters or comp in self.computation_map
        if node.opcode == "reverse":
            return self.options.is_spmd
        if node.opcode == "custom-call":
            return self.options.is_spmd and node.inst.attr("custom_call_target") in SHARDABLE_CUSTOM_CALLS
        return False

    @property
    def allow_output(self) -> bool:
        return any(self.options.allow_to_output)

    @property
    def allow_parameters(self) -> bool:
        return any(self.options.allow_to_parameters)

"""State shared by the propagation rules during one run.

`improve()` is XLA's MaybeImproveInstructionSharding with provenance: every
change of a node's sharding records the rule and the neighbours it came from.

The context also records what an inference depended on, so the driver can
skip inferences that cannot change anything (see `worklist.py`): which
aggressiveness thresholds a rule tested (`levels_read`), and, through `set`,
which nodes changed (every reader of a changed node is marked stale).
"""

from __future__ import annotations

from planner.hlo.ir.opcodes import BINARY_ELEMENTWISE, TERNARY_ELEMENTWISE, UNARY_ELEMENTWISE
from planner.hlo.ir.shapes import ArrayShape, TupleShape
from planner.prepare.propagation_options import PropagationOptions
from planner.propagation.shared.graph import BACKWARD, FORWARD, Graph, Node, Provenance, leaf_offsets
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
# Custom-calls that pass their operand's sharding through when they take one array of their own rank
# (`IsPassthroughCustomOps`): host offload's MoveToHost and MoveToDevice among them. JAX's
# `annotate_device_placement` is one of those two by then: XLA converts it before propagating
# (`ConvertMemoryPlacementToInternalAnnotations`).
SAME_RANK_PASSTHROUGH_CUSTOM_CALLS = frozenset(
    {"ResizeNearest", "ResizeBilinear", "ResizeNearestGrad", "ResizeBilinearGrad", "Cholesky", "MoveToDevice",
     "MoveToHost", "annotate_device_placement"}
)  # fmt: skip


def is_passthrough_custom_call(node: Node) -> bool:
    """XLA's `IsPassthroughCustomOps`: the custom-call's sharding is its operand's."""
    if node.opcode != "custom-call":
        return False
    target = node.inst.attr("custom_call_target")
    if target in PASSTHROUGH_CUSTOM_CALLS:
        return True
    return (
        target in SAME_RANK_PASSTHROUGH_CUSTOM_CALLS
        and len(node.operands) == 1
        and node.is_array
        and node.operands[0].is_array
        and node.operands[0].rank == node.rank
    )


# Levels run 0..3; a rule that reads the level as a number depends on all of them.
ALL_LEVELS = 0b1111

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
        self._level = 0
        # Bit t set: the running inference tested `aggressiveness >= t` (ALL_LEVELS: it read the level itself).
        self.levels_read = 0
        self.iteration = 0
        # Partial annotations: id(node) -> dims the annotation leaves open.
        self.unspecified_dims: dict[int, tuple[int, ...]] = {}

    @property
    def aggressiveness(self) -> int:
        """The level itself: a rule that reads it depends on every level."""
        self.levels_read |= ALL_LEVELS
        return self._level

    @aggressiveness.setter
    def aggressiveness(self, level: int) -> None:
        self._level = level

    def swap_level(self, level: int) -> int:
        """Sets the level and returns the old one (a rule asking at another level puts it back)."""
        old, self._level = self._level, level
        return old

    def at_least(self, level: int) -> bool:
        """`aggressiveness >= level`, recorded: the rule's result can change only where this test does."""
        self.levels_read |= 1 << level
        return self._level >= level

    @property
    def combine_partial(self) -> bool:
        return self.options.is_spmd and self.at_least(1)

    def is_provided(self, node: Node) -> bool:
        return id(node) in self.provided

    def non_root_users(self, node: Node) -> int:
        root = self.graph.root(node.computation)
        return len(node.users) - (1 if root in node.users else 0)

    def set(self, node: Node, sharding: HloSharding, rule: str, sources: tuple[Node, ...] = ()) -> None:
        old = node.sharding
        node.sharding = sharding
        node.provenance = Provenance(rule, tuple(s.name for s in sources), self._level, self.iteration)
        if old is not None and old.is_tuple and sharding.is_tuple and len(old.elements) == len(sharding.elements):
            _mark_tuple_readers(node, old, sharding)
            return
        for reader in node.visits[FORWARD].readers:
            reader.visits[FORWARD].current = False
        for reader in node.visits[BACKWARD].readers:
            reader.visits[BACKWARD].current = False

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
            return self.at_least(2)
        return self.at_least(1)

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
            return self.options.is_spmd and (
                node.inst.attr("custom_call_target") in SHARDABLE_CUSTOM_CALLS or is_passthrough_custom_call(node)
            )
        return False

    @property
    def allow_output(self) -> bool:
        return any(self.options.allow_to_output)

    @property
    def allow_parameters(self) -> bool:
        return any(self.options.allow_to_parameters)


# Backward rules that read the user's other operands too (GetShardingFromUser's dot, convolution,
# reduce and scatter cases); every other rule reads only the user and the operand asking.
READS_SIBLINGS = frozenset({"dot", "convolution", "reduce", "scatter"})


def _mark_tuple_readers(node: Node, old: HloSharding, new: HloSharding) -> None:
    """A tuple's sharding changed in some leaves: only readers of those leaves are stale.

    A get-tuple-element reads one element of its operand, and an operand of a tuple reads (backward)
    the element(s) at its positions; a 118-element loop state changing one leaf re-queues one reader,
    not 118.
    """
    changed = [a is not b and a != b for a, b in zip(old.elements, new.elements)]
    offsets = leaf_offsets(node.shape) if isinstance(node.shape, TupleShape) else None

    def touches(positions: list[int]) -> bool:
        assert offsets is not None
        return any(any(changed[offsets[k] : offsets[k + 1]]) for k in positions)

    for reader in node.visits[FORWARD].readers:
        reads_one_element = reader is not node and reader.opcode == "get-tuple-element" and reader.operands[0] is node
        if offsets is not None and reads_one_element and not touches([reader.inst.attr("index")]):
            continue
        reader.visits[FORWARD].current = False
    for reader in node.visits[BACKWARD].readers:
        if offsets is not None and reader is not node and node.opcode == "tuple":
            positions = [k for k, o in enumerate(node.operands) if o is reader]
            through_siblings = any(
                u is not node and u.opcode in READS_SIBLINGS and node in u.operands for u in reader.users
            )
            if positions and not through_siblings and not touches(positions):
                continue
        reader.visits[BACKWARD].current = False

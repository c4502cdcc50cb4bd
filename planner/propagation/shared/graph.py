"""The mutable working graph propagation runs on.

The IR is immutable; propagation needs to rewrite a little (Sharding
custom-calls become copies, shard_as-only annotations disappear, an entry root
While gets a copy above it) and to set shardings many times. Each instruction
becomes a `Node` holding its operands, its users in the order XLA keeps them,
and its current sharding with the provenance of that sharding.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.hlo.ir.module import HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape, Shape, TupleShape
from planner.hlo.ir.tuple_leaves import leaf_count, leaf_offsets
from planner.sharding.hlo_sharding import HloSharding


@dataclass(frozen=True, slots=True)
class Provenance:
    """Why a node has its sharding: the rule and the neighbours it came from."""

    rule: str
    sources: tuple[str, ...] = ()
    aggressiveness: int = -1
    iteration: int = -1


# Directions of inference, indexing `Node.visits`.
FORWARD, BACKWARD = 0, 1


class Visit:
    """The worklist's record of a node's inferences in one direction (worklist.py).

    `readers`: the nodes whose inference reads this one's sharding. `current`: the last inference
    changed nothing and nothing it reads has changed since; it ran at aggressiveness `level` and
    tested the thresholds in `levels_read`.
    """

    __slots__ = ("current", "level", "levels_read", "readers")

    def __init__(self) -> None:
        self.readers: list[Node] = []
        self.current = False
        self.level = 0
        self.levels_read = 0


class Node:
    __slots__ = (
        "called",
        "computation",
        "inst",
        "name",
        "opcode",
        "operands",
        "provenance",
        "shape",
        "sharding",
        "unknown_reason",
        "users",
        "visits",
    )

    def __init__(self, inst: Instruction, computation: str) -> None:
        self.inst = inst
        self.name = inst.name
        self.opcode = inst.opcode
        self.shape: Shape = inst.shape
        self.computation = computation
        self.operands: list[Node] = []
        self.users: list[Node] = []
        self.sharding: HloSharding | None = inst.sharding
        self.provenance: Provenance | None = Provenance("annotation") if inst.sharding is not None else None
        self.called: tuple[str, ...] = inst.called_computations
        # Set when no rule models this op: the reason is reported, never guessed.
        self.unknown_reason: str | None = None
        # The worklist's records of this node's inferences, forward and backward (worklist.py).
        self.visits = (Visit(), Visit())

    def __repr__(self) -> str:
        return f"Node({self.computation}/{self.name} {self.opcode})"

    @property
    def is_array(self) -> bool:
        return isinstance(self.shape, ArrayShape)

    @property
    def dims(self) -> tuple[int, ...]:
        assert isinstance(self.shape, ArrayShape), f"{self.name} is a tuple"
        return self.shape.dims

    @property
    def rank(self) -> int:
        return len(self.dims)

    def operand_index(self, operand: Node) -> int:
        return next(i for i, o in enumerate(self.operands) if o is operand)

    def is_custom_call(self, target: str) -> bool:
        return self.opcode == "custom-call" and self.inst.attr("custom_call_target") == target


class Graph:
    """Nodes per computation, in text order, with XLA's post order on demand."""

    def __init__(self, module: HloModule) -> None:
        self.module = module
        self.computations: dict[str, list[Node]] = {}
        self.roots: dict[str, Node] = {}
        self.entry = module.entry_name
        names: set[str] = set()
        for comp in module.computations:
            nodes: dict[str, Node] = {}
            for inst in comp.instructions:
                node = Node(inst, comp.name)
                for operand_name in inst.operands:
                    operand = nodes[operand_name]
                    node.operands.append(operand)
                    if node not in operand.users:
                        operand.users.append(node)
                nodes[inst.name] = node
                names.add(inst.name)
            self.computations[comp.name] = list(nodes.values())
            self.roots[comp.name] = nodes[comp.root_name]
        self._taken_names = names
        self._post_orders: dict[str, list[Node]] = {}
        self._removed: set[Node] = set()  # held, so a removed node is never mistaken for a new one

    def structure_changed(self) -> None:
        self._post_orders.clear()

    def release(self) -> None:
        """Drops the links between nodes once the pass is done with them.

        Operand, user and reader lists are the graph's only cycles: without them, and with the graph
        letting go of its nodes (the pass's nested functions keep the graph itself in a cycle), the
        nodes are freed as soon as the last reference goes, not by the cycle collector walking every
        node of every simulation a plan ran. The graph is empty afterwards.
        """
        for node in [*self.nodes(), *self._removed]:
            node.operands = []
            node.users = []
            for visit in node.visits:
                visit.readers = []
        self.computations = {}
        self.roots = {}
        self._post_orders.clear()
        self._removed.clear()

    def contains(self, node: Node) -> bool:
        """Still in the graph (not replaced by `replace_uses`)."""
        return node not in self._removed

    def nodes(self) -> list[Node]:
        return [n for nodes in self.computations.values() for n in nodes]

    def root(self, computation: str) -> Node:
        return self.roots[computation]

    def parameters(self, computation: str) -> list[Node]:
        params = [n for n in self.computations[computation] if n.opcode == "parameter"]
        return sorted(params, key=lambda n: n.inst.parameter_number or 0)

    def post_order(self, computation: str) -> list[Node]:
        """MakeInstructionPostOrder: DFS from each user-less node in list order, operand 0 first.

        Cached: the graph's structure is fixed once propagation starts, and
        every rewrite before that goes through methods that drop the cache.
        """
        cached = self._post_orders.get(computation)
        if cached is not None:
            return cached
        order: list[Node] = []
        visited: set[int] = set()
        for start in self.computations[computation]:
            if start.users or id(start) in visited:
                continue
            stack: list[tuple[Node, bool]] = [(start, False)]
            while stack:
                node, expanded = stack.pop()
                if expanded:
                    order.append(node)
                    continue
                if id(node) in visited:
                    continue
                visited.add(id(node))
                stack.append((node, True))
                for operand in reversed(node.operands):
                    if id(operand) not in visited:
                        stack.append((operand, False))
        self._post_orders[computation] = order
        return order

    def fresh_name(self, prefix: str) -> str:
        """XLA's name uniquer: `copy`, then `copy.1`, `copy.2`, ..."""
        name, k = prefix, 0
        while name in self._taken_names:
            k += 1
            name = f"{prefix}.{k}"
        self._taken_names.add(name)
        return name

    def replace_uses(self, old: Node, new: Node) -> None:
        """Every user of `old` reads `new` instead; `old` leaves the graph."""
        for user in old.users:
            user.operands = [new if o is old else o for o in user.operands]
            if user not in new.users:
                new.users.append(user)
        for operand in old.operands:
            operand.users = [u for u in operand.users if u is not old]
        nodes = self.computations[old.computation]
        nodes.remove(old)
        self._removed.add(old)
        self.structure_changed()
        if self.roots[old.computation] is old:
            self.roots[old.computation] = new


def sub_sharding(sharding: HloSharding, shape: Shape, index: int) -> HloSharding:
    """GetSubSharding for top-level tuple element `index`."""
    assert isinstance(shape, TupleShape)
    if not sharding.is_tuple:
        return sharding
    offsets = leaf_offsets(shape)
    element = shape.elements[index]
    if isinstance(element, TupleShape):
        return HloSharding.tuple_of(sharding.elements[offsets[index] : offsets[index + 1]])
    return sharding.elements[offsets[index]]


def tuple_sharding_for(shape: Shape, leaf: HloSharding) -> HloSharding:
    """NormalizeTupleSharding: one leaf sharding for every leaf of `shape`."""
    if isinstance(shape, TupleShape):
        return HloSharding.tuple_of((leaf,) * max(leaf_count(shape), 1))
    return leaf

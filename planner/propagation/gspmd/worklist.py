"""The worklist under the fixed point: which visits can be skipped, exactly.

The fixed point is a worklist over XLA's order. XLA visits every instruction
not in its done-sets, in post order, and clears those sets at each level;
most visits change nothing. Here a visit is skipped when it provably changes
nothing: its last inference in that direction changed nothing, no node that
inference reads (`forward_reads` / `backward_reads` below) has changed since, and
no aggressiveness threshold it tested lies between the level it ran at and
this one. A skipped visit leaves the node done, as XLA's no-op visit would,
so the order of the visits that do change something is XLA's, unchanged.
`SPMD_PLANNER_WORKLIST=check` runs every skipped inference anyway and fails
if one would have changed anything; `=off` visits everything.

Staleness is pushed, not polled: `Context.set` marks every reader of a changed node (element-wise
for tuples, see `context._mark_tuple_readers`); `index_readers` builds the reader lists once the
graph's structure is final.
"""

from __future__ import annotations

from planner.propagation.gspmd.context import READS_SIBLINGS, Context
from planner.propagation.shared.graph import BACKWARD, FORWARD, Graph, Node


def tested_between(levels_read: int, since: int, level: int) -> bool:
    """Did the inference test a threshold t with since < t <= level (where its answer flips)?"""
    between = ((1 << (level + 1)) - 1) & ~((1 << (since + 1)) - 1)
    return levels_read & between != 0


def forward_reads(node: Node, ctx: Context) -> list[Node]:
    """Every node whose sharding the forward inference of `node` may read.

    Its operands; a called computation's parameter reads its caller's operands; a dot or
    convolution looks ahead along its chain of single users for the sharding they want.
    """
    reads = [node, *node.operands]
    caller = ctx.computation_map.get(node.computation)
    if caller is not None and node.opcode == "parameter":
        reads += [caller, *caller.operands]
    if node.opcode in ("dot", "convolution"):
        current = node
        while len(current.users) == 1 and current.users[0] not in reads:
            current = current.users[0]
            reads.append(current)
    return reads


def backward_reads(node: Node, ctx: Context) -> list[Node]:
    """Every node whose sharding the backward inference of `node` may read.

    Its users, and the other operands of users whose rule reads them (READS_SIBLINGS).
    """
    reads = [node]
    for user in node.users:
        reads.append(user)
        if user.opcode in READS_SIBLINGS:
            reads += user.operands
    return reads


def index_readers(graph: Graph, ctx: Context) -> None:
    """Who reads whom: each node's sharding is read by the inferences listed in its reader lists."""
    for node in graph.nodes():
        for direction, reads in ((FORWARD, forward_reads(node, ctx)), (BACKWARD, backward_reads(node, ctx))):
            for read in dict.fromkeys(reads):
                read.visits[direction].readers.append(node)

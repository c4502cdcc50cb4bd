"""The order XLA:CPU runs a computation's instructions in, as its memory scheduler picks it.

XLA:CPU schedules every computation with its default memory scheduler, which builds several orders
(a list schedule, a depth-first one, the post order) and keeps the one whose heap is smallest. The text
of a lowered step is one program order; the list scheduler's is often much leaner: among the
instructions whose operands are ready it runs first the one that frees the most bytes for what it
allocates, so a large temporary is made only when what reads it is about to run, not where the
program happened to write it. The memory model measures both orders for each computation and keeps
the smaller peak, as XLA does.

Worked example: `a = dot(x, w)` (32 MiB) is read only by the last instruction of a body, and `b`, `c`
(8 MiB each) are made and freed in between. Program order holds `a` through `b` and `c` (48 MiB at the
peak); the list scheduler runs `b` and `c` first, since `a` frees nothing and allocates the most, and
makes `a` just before its reader (32 MiB).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Mapping

from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.memory.buffers import Value
from planner.memory.values import ValueModel, reads_leaf


def list_schedule(comp: Computation, model: ValueModel) -> tuple[Instruction, ...]:
    """`comp`'s instructions in the order a greedy memory-minimising list scheduler runs them.

    Ready instructions compete on the bytes they free (buffers whose last reader they are) minus the
    bytes they allocate; ties keep program order, and the root runs last.
    """
    name = comp.name
    index = {inst.name: k for k, inst in enumerate(comp.instructions)}
    leaves: dict[str, list[Value]] = {}
    size: dict[Value, int] = {}  # per buffer: its largest value
    for value in model.values_in.get(name, []):
        leaves.setdefault(value[1], []).append(value)
        group = model.uf.find(value)
        size[group] = max(size.get(group, 0), model.size[value])
    # Each buffer is allocated by the first instruction (in program order) defining one of its values.
    owner: dict[Value, str] = {}
    allocates = dict.fromkeys(index, 0)
    for inst in comp.instructions:
        for value in leaves.get(inst.name, []):
            group = model.uf.find(value)
            if value in model.allocating and group not in owner:
                owner[group] = inst.name
                allocates[inst.name] += model.size[value]
    reads: dict[str, set[Value]] = {n: set() for n in index}
    waiting: dict[Value, set[str]] = {}
    for inst in comp.instructions:
        for operand in dict.fromkeys(inst.operands):
            for value in leaves.get(operand, []):
                if not reads_leaf(comp, inst, value[2]):
                    continue
                group = model.uf.find(value)
                reads[inst.name].add(group)
                waiting.setdefault(group, set()).add(inst.name)
    # The ready instruction with the largest (freed - allocated, -index) runs next. What an instruction
    # frees only grows while it waits (its buffers lose other readers, their owners run), so a heap of
    # keys with stale entries skipped picks what a scan over every ready instruction would, in log time.
    owned: dict[str, list[Value]] = {}
    for group, owner_name in owner.items():
        owned.setdefault(owner_name, []).append(group)
    done: set[str] = set()
    # No nested functions here: compiled, they would keep this frame's sets in a reference cycle.
    current: dict[str, tuple[int, int]] = {}
    heap: list[tuple[int, int, str]] = []
    missing = {inst.name: len(set(inst.operands)) for inst in comp.instructions}
    for inst in comp.instructions:
        if missing[inst.name] == 0:
            _push(inst.name, _key(inst.name, reads, waiting, size, owner, done, allocates, index), current, heap)
    order: list[Instruction] = []
    root = comp.root_name
    while current:
        held_root = False
        while True:
            cost, position, best = heapq.heappop(heap)
            if current.get(best) != (cost, position):
                continue  # stale: the instruction ran, or its key grew since
            if best == root and len(current) > 1:
                held_root = True  # the root runs last
                continue
            break
        if held_root:
            heapq.heappush(heap, (*current[root], root))
        del current[best]
        done.add(best)
        order.append(comp[best])
        touched: set[str] = set()
        # Only a buffer left with one reader, its owner done, adds to what that reader frees.
        for group in reads[best]:
            waiting[group].discard(best)
            if len(waiting[group]) == 1:
                touched.update(waiting[group])
        for group in owned.get(best, ()):
            if len(waiting.get(group, ())) == 1:
                touched.update(waiting[group])
        for candidate in touched:
            if candidate in current:
                _push(candidate, _key(candidate, reads, waiting, size, owner, done, allocates, index), current, heap)
        for user in comp.users(best):
            missing[user] -= 1
            if missing[user] == 0:
                _push(user, _key(user, reads, waiting, size, owner, done, allocates, index), current, heap)
    if len(order) != len(comp.instructions):
        return comp.instructions  # a cycle cannot be scheduled: keep the program order
    return tuple(order)


def _key(
    candidate: str,
    reads: dict[str, set[Value]],
    waiting: dict[Value, set[str]],
    size: dict[Value, int],
    owner: dict[Value, str],
    done: set[str],
    allocates: dict[str, int],
    index: dict[str, int],
) -> tuple[int, int]:
    """(bytes allocated - bytes freed, program index): the smallest runs next."""
    freed = sum(size[g] for g in reads[candidate] if len(waiting[g]) == 1 and owner.get(g, "") in done)
    return (allocates[candidate] - freed, index[candidate])


def _push(
    candidate: str, key: tuple[int, int], current: dict[str, tuple[int, int]], heap: list[tuple[int, int, str]]
) -> None:
    """Records `candidate`'s key; a key that changed goes on the heap (the old entry turns stale)."""
    if current.get(candidate) != key:
        current[candidate] = key
        heapq.heappush(heap, (key[0], key[1], candidate))


def with_schedule(module: HloModule, orders: Mapping[str, tuple[Instruction, ...]]) -> HloModule:
    """`module` with the computations named in `orders` in those instruction orders."""
    return dataclasses.replace(
        module,
        computations=tuple(
            dataclasses.replace(comp, instructions=orders[comp.name]) if comp.name in orders else comp
            for comp in module.computations
        ),
    )

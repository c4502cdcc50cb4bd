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
from collections.abc import Mapping

from planner.hlo.ir import Computation, HloModule, Instruction
from planner.memory.buffers import Value
from planner.memory.values import ValueModel


def list_schedule(comp: Computation, model: ValueModel) -> tuple[Instruction, ...]:
    """`comp`'s instructions in the order a greedy memory-minimising list scheduler runs them.

    Ready instructions compete on the bytes they free (buffers whose last reader they are) minus the
    bytes they allocate; ties keep program order, and the root runs last.
    """
    name = comp.name
    index = {inst.name: k for k, inst in enumerate(comp.instructions)}
    leaves: dict[str, list[Value]] = {}
    size: dict[Value, int] = {}  # per buffer: its largest value
    for value, value_bytes in model.size.items():
        if value[0] == name:
            leaves.setdefault(value[1], []).append(value)
            group = model.uf.find(value)
            size[group] = max(size.get(group, 0), value_bytes)
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
                group = model.uf.find(value)
                reads[inst.name].add(group)
                waiting.setdefault(group, set()).add(inst.name)
    missing = {inst.name: len(set(inst.operands)) for inst in comp.instructions}
    ready = [inst.name for inst in comp.instructions if missing[inst.name] == 0]
    done: set[str] = set()
    order: list[Instruction] = []
    while ready:
        best, best_key = ready[0], None
        for candidate in ready:
            if candidate == comp.root_name and len(ready) > 1:
                continue
            freed = sum(size[g] for g in reads[candidate] if waiting[g] == {candidate} and owner.get(g, "") in done)
            key = (freed - allocates[candidate], -index[candidate])
            if best_key is None or key > best_key:
                best, best_key = candidate, key
        ready.remove(best)
        done.add(best)
        order.append(comp[best])
        for group in reads[best]:
            waiting[group].discard(best)
        for user in comp.users(best):
            missing[user] -= 1
            if missing[user] == 0:
                ready.append(user)
    if len(order) != len(comp.instructions):
        return comp.instructions  # a cycle cannot be scheduled: keep the program order
    return tuple(order)


def with_schedule(module: HloModule, orders: Mapping[str, tuple[Instruction, ...]]) -> HloModule:
    """`module` with the computations named in `orders` in those instruction orders."""
    return dataclasses.replace(
        module,
        computations=tuple(
            dataclasses.replace(comp, instructions=orders[comp.name]) if comp.name in orders else comp
            for comp in module.computations
        ),
    )

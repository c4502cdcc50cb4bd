"""The order XLA:CPU runs a computation's instructions in.

XLA:CPU schedules every computation breadth-first (`bfs_schedule`): its compiler picks
`BFSMemoryScheduler` while `xla_cpu_enable_concurrency_optimized_scheduler` is on, the default, so that
instructions with no data between them run side by side on the host's threads. Memory is not its
criterion: whatever depends only on parameters (a weight's all-gather, its transposing copy) runs at the
start, and its result is held until its last reader runs, however late.

Worked example: a plain-loop step of four layers gathers each layer's weights (`all-gather(param)`, 8
MiB each) for the dots that read them. Breadth-first, all four gathers run at the start, level with the
embedding lookup, so at layer 0's dots a device holds 32 MiB of gathered weights; in program order it
held 8 MiB (the gather is written beside its dot). On a transformers Llama step, XLA:CPU's heap is 115.5
MiB with the breadth-first schedule and 83.1 MiB with `--xla_cpu_enable_concurrency_optimized_scheduler
=false`.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Mapping

from planner.hlo.ir.module import Computation, HloModule, Instruction


def bfs_schedule(comp: Computation, fused: frozenset[str] | set[str] = frozenset()) -> tuple[Instruction, ...]:
    """`comp`'s instructions breadth-first, as XLA's `BFSMemoryScheduler` orders them.

    A first-in first-out queue starts with the instructions that read nothing, in program order; the
    one at its front runs, and each of its users (in program order) joins the back once its last operand
    has run. XLA schedules the module after fusion, where a fusion is one instruction: an instruction in
    `fused` (a view, or an op fusion computes inside its consumer) runs as soon as it is ready, not a
    level later, so its consumer is ready when its real inputs are. The root runs last.
    """
    missing = {inst.name: len(set(inst.operands)) for inst in comp.instructions}
    ready = deque(inst.name for inst in comp.instructions if missing[inst.name] == 0)
    order: list[Instruction] = []
    root = comp.root_name
    while ready:
        name = ready.popleft()
        if name == root and ready:
            ready.append(name)  # an instruction that does not reach the root runs before it
            continue
        now = deque([name])
        while now:
            running = now.popleft()
            order.append(comp[running])
            for user in comp.users(running):
                missing[user] -= 1
                if missing[user] == 0:
                    if user in fused and user != root:
                        now.append(user)
                    else:
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

"""Where XLA's instruction list has the instructions nothing reads: after the root, when a pass added them.

Propagation visits a computation in `MakeInstructionPostOrder`: a DFS from each instruction with no
users, in the order of the computation's instruction list. Text order here is the list order as
the module was written, kept topological because it is also the memory model's schedule. XLA's
list differs in one way: every instruction a pass adds (`HloComputation::AddInstruction`) is
appended at its end, after the root. The CallInliner adds every clone of a callee that way
(`xla/service/call_inliner.cc`, `SubcomputationInsertionVisitor::DefaultAction`), and computation
clones (the loop passes' rebuilt bodies) keep the original's list order (`CloneInContext` sorts the
clone back into it), so an inlined instruction with a side effect that the tuple simplifier and DCE
leave with no users is a DFS root after the caller's root in XLA's list, visited after the root's
whole graph.

That order decides a shard_as group: its members are aligned to whichever is decided first. On
torch_xla's scan steps the backward body `shard_alike`s each layer-0 weight with its gradient
(user-less once the call's tuple is forwarded). Visited before the root, the output projection's
weight (fsdp,tp) reached the group first and every attention gradient took its layout (4 of the
loop's 53 elements transposed per device); after the root, XLA:TPU's order, the gradients
decide first, as in its dump (`after_dce.before_sharding-propagation` prints the annotations after
`ROOT`).

This step moves such instructions (with side effects, no users, not an instruction the
computation had as written) to the end, after the root, keeping their order; nothing else moves,
and nothing reads them, so text order stays topological. It runs last, when the tuple simplifier
and DCE have left them without users (before, the inlined callee's tuple still read them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from planner.hlo.ir.module import HloModule
from planner.prepare.edit import ComputationEdit, ModuleEdit, has_side_effect
from planner.prepare.rewrite import Rewrite


@dataclass(frozen=True)
class AddedRootsLast:
    NAME: ClassVar[str] = "list-order"
    MIRRORS: ClassVar[str] = (
        "HloComputation::AddInstruction (appends) and MakeInstructionPostOrder, for call_inliner.cc's clones"
    )

    # (computation, instruction) pairs of the module as written: the instructions XLA's list has in
    # text order. Anything else was added by a pass (an inlined clone), at the end of the list.
    written: frozenset[tuple[str, str]] = field(default=frozenset())

    @staticmethod
    def of(source: HloModule) -> AddedRootsLast:
        return AddedRootsLast(frozenset((c.name, i.name) for c in source.computations for i in c.instructions))

    def run(self, module: HloModule) -> Rewrite:
        edit = ModuleEdit(module)
        moved = sum(self._move(comp) for comp in edit.computations.values())
        if not moved:
            return Rewrite(module)
        return Rewrite(edit.freeze(), summary=f"{moved} user-less inlined instructions placed after their root")

    def _move(self, comp: ComputationEdit) -> int:
        if (comp.name, comp.root_name) not in self.written:
            return 0  # a root a pass made sits among the added instructions itself
        order = [i.name for i in comp]
        root_at = order.index(comp.root_name)
        late = [
            n for n in order[:root_at]
            if not comp.has_users(n) and has_side_effect(comp[n]) and (comp.name, n) not in self.written
        ]  # fmt: skip
        if not late:
            return 0
        gone = set(late)
        comp.reorder([n for n in order if n not in gone] + late)
        return len(late)

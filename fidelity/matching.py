"""Which instruction of our prepared module is which instruction of a compiler's module, by structure.

XLA:TPU renames nearly every instruction its loop passes touch (a body cloned three times keeps
none of its names), so instructions are paired by where they sit, not by name: the entries and
their parameters and roots pair first; a pair pairs the operands in the same positions and the
users reading them in the same position when opcode and dims agree and the pairing is unique; a
paired While pairs its body and condition, their parameters and roots; a paired instruction that
calls a computation pairs it. Where the two modules differ in structure (a rewrite one compiler
made and the other did not), pairing stops at the difference, and those instructions are not
compared: `Pairing.coverage` says how many were.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.hlo.ir.shapes import Shape, TupleShape


def _dims(shape: Shape) -> Hashable:
    if isinstance(shape, TupleShape):
        return tuple(_dims(e) for e in shape.elements)
    return (shape.element_type, shape.dims)


def _alike(a: Instruction, b: Instruction) -> bool:
    if a.opcode != b.opcode or _dims(a.shape) != _dims(b.shape) or len(a.operands) != len(b.operands):
        return False
    if a.opcode == "get-tuple-element":
        return bool(a.attr("index") == b.attr("index"))
    if a.opcode == "parameter":
        return a.parameter_number == b.parameter_number
    return True


@dataclass
class Pairing:
    """Our instruction name -> theirs, with the computation each sits in."""

    pairs: dict[tuple[str, str], tuple[str, str]]
    ours_total: int

    @property
    def coverage(self) -> float:
        return len(self.pairs) / self.ours_total if self.ours_total else 0.0


def pair_instructions(ours: HloModule, theirs: HloModule) -> Pairing:
    matcher = _Matcher(ours, theirs)
    matcher.pair_computations(ours.entry, theirs.entry)
    matcher.run()
    return Pairing(matcher.pairs, ours.num_instructions)


class _Matcher:
    def __init__(self, ours: HloModule, theirs: HloModule) -> None:
        self.ours, self.theirs = ours, theirs
        self.pairs: dict[tuple[str, str], tuple[str, str]] = {}
        self.taken: set[tuple[str, str]] = set()
        self.computations: dict[str, str] = {}
        self.worklist: list[tuple[Computation, Instruction, Computation, Instruction]] = []

    def pair_computations(self, a: Computation, b: Computation) -> None:
        if a.name in self.computations or b.name in self.computations.values():
            return
        if len(a.parameters) != len(b.parameters):
            return
        self.computations[a.name] = b.name
        for p, q in zip(a.parameters, b.parameters):
            self.pair(a, p, b, q)
        self.pair(a, a.root, b, b.root)

    def pair(self, ca: Computation, a: Instruction, cb: Computation, b: Instruction) -> None:
        key, value = (ca.name, a.name), (cb.name, b.name)
        if key in self.pairs or value in self.taken or not _alike(a, b):
            return
        self.pairs[key] = value
        self.taken.add(value)
        self.worklist.append((ca, a, cb, b))

    def run(self) -> None:
        while self.worklist:
            ca, a, cb, b = self.worklist.pop()
            for x, y in zip(a.operands, b.operands):
                self.pair(ca, ca[x], cb, cb[y])
            self._pair_users(ca, a, cb, b)
            for x, y in zip(a.called_computations, b.called_computations):
                if self.ours.has_computation(x) and self.theirs.has_computation(y):
                    self.pair_computations(self.ours.computation(x), self.theirs.computation(y))

    def _pair_users(self, ca: Computation, a: Instruction, cb: Computation, b: Instruction) -> None:
        def slots(comp: Computation, inst: Instruction) -> dict[Hashable, list[Instruction]]:
            found: dict[Hashable, list[Instruction]] = {}
            for name in comp.users(inst.name):
                user = comp[name]
                for k, op in enumerate(user.operands):
                    if op == inst.name:
                        key = (
                            user.opcode,
                            _dims(user.shape),
                            k,
                            user.attr("index") if user.opcode == "get-tuple-element" else None,
                        )
                        found.setdefault(key, []).append(user)
            return found

        mine, yours = slots(ca, a), slots(cb, b)
        for key, users in mine.items():
            others = yours.get(key, [])
            if len(users) == 1 and len(others) == 1:
                self.pair(ca, users[0], cb, others[0])

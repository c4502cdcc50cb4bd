"""A working copy of a module that passes rewrite in place, then freeze back into the immutable IR.

XLA's passes are written against a mutable graph (replace an operand, add an instruction, remove a
dead one); writing them as rebuilds of frozen tuples would hide what each one does. `ModuleEdit`
gives them that graph: instructions by name in program order per computation, users kept up to date
on every change, fresh names that never collide, and `freeze()` back to an `HloModule`.

Program order matters to the planner (text order is the schedule the memory model walks), so new
instructions go where XLA's own pass would put them: before their first user, or at a place the
pass names.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Iterator

from planner.hlo.ir.module import Attribute, Computation, HloModule, Instruction
from planner.hlo.ir.shapes import Shape, TupleShape

_NUMBERED = re.compile(r"^(.*?)\.(\d+)$")


class ComputationEdit:
    """One computation's instructions, in program order, with their users."""

    def __init__(self, comp: Computation, module: ModuleEdit) -> None:
        self.name = comp.name
        self.is_entry = comp.is_entry
        self.extra = comp.extra
        self.line = comp.line
        self.root_name = comp.root_name
        self._module = module
        self._order: list[str] = [i.name for i in comp.instructions]
        self._insts: dict[str, Instruction] = {i.name: i for i in comp.instructions}
        self._users: dict[str, list[str]] = {i.name: [] for i in comp.instructions}
        for inst in comp.instructions:
            for op in dict.fromkeys(inst.operands):
                self._users[op].append(inst.name)
        self._positions: dict[str, int] | None = None  # built on demand, dropped when the order changes

    # -- reading -------------------------------------------------------------------------------------

    def __getitem__(self, name: str) -> Instruction:
        return self._insts[name]

    def __contains__(self, name: object) -> bool:
        return name in self._insts

    def __iter__(self) -> Iterator[Instruction]:
        """The instructions in program order, each read when reached: a rewrite made while walking
        is seen, and an instruction removed before it is reached is skipped."""
        return (self._insts[n] for n in list(self._order) if n in self._insts)

    def __len__(self) -> int:
        return len(self._order)

    @property
    def root(self) -> Instruction:
        return self._insts[self.root_name]

    @property
    def parameters(self) -> list[Instruction]:
        params = [i for i in self._insts.values() if i.opcode == "parameter"]
        return sorted(params, key=lambda i: i.parameter_number or 0)

    def users(self, name: str) -> list[Instruction]:
        """Instructions that read `name`, in program order, once each."""
        if self._positions is None:
            self._positions = {n: k for k, n in enumerate(self._order)}
        position = self._positions
        return [self._insts[u] for u in sorted(self._users[name], key=position.__getitem__)]

    def has_users(self, name: str) -> bool:
        return bool(self._users[name])

    # -- changing ------------------------------------------------------------------------------------

    def add(self, inst: Instruction, before: str | None = None) -> Instruction:
        """Adds `inst` before `before` (default: before the root, the end of the computation's work)."""
        if inst.name in self._insts:
            raise ValueError(f"{inst.name} is already in {self.name}")
        anchor = before if before is not None else self.root_name
        self._order.insert(self._order.index(anchor), inst.name)
        self._positions = None
        self._insts[inst.name] = inst
        self._users[inst.name] = []
        for op in dict.fromkeys(inst.operands):
            self._users[op].append(inst.name)
        self._module.names.add(inst.name)
        return inst

    def replace(self, inst: Instruction) -> None:
        """The instruction of the same name becomes `inst` (new operands, shape or attributes)."""
        old = self._insts[inst.name]
        for op in dict.fromkeys(old.operands):
            self._users[op].remove(inst.name)
        self._insts[inst.name] = inst
        for op in dict.fromkeys(inst.operands):
            self._users[op].append(inst.name)

    def set_operands(self, name: str, operands: tuple[str, ...]) -> None:
        self.replace(dataclasses.replace(self._insts[name], operands=operands))

    def replace_uses(self, old: str, new: str, keep: tuple[str, int] | None = None) -> None:
        """Every read of `old` reads `new` instead, except operand `keep[1]` of `keep[0]`; the root too."""
        for user in list(self._users[old]):
            inst = self._insts[user]
            operands = tuple(
                new if o == old and not (keep is not None and (user, k) == keep) else o
                for k, o in enumerate(inst.operands)
            )
            if operands != inst.operands:
                self.set_operands(user, operands)
        if self.root_name == old:
            self.root_name = new

    def reorder(self, order: list[str]) -> None:
        """The same instructions in program order `order` (the caller keeps it topological)."""
        if sorted(order) != sorted(self._order):
            raise ValueError(f"reorder of {self.name} must keep its instructions")
        self._order = list(order)
        self._positions = None

    def remove(self, name: str) -> None:
        """Removes an instruction nothing reads."""
        if self._users[name] or name == self.root_name:
            raise ValueError(f"{name} in {self.name} is still used")
        inst = self._insts.pop(name)
        self._order.remove(name)
        self._positions = None
        for op in dict.fromkeys(inst.operands):
            self._users[op].remove(name)
        del self._users[name]

    def remove_dead(self, keep_parameters: bool = True) -> list[str]:
        """Removes everything the root does not reach (side-effecting ops and parameters stay)."""
        live: set[str] = set()
        stack = [self.root_name]
        for n in self._order:
            inst = self._insts[n]
            if (keep_parameters and inst.opcode == "parameter") or has_side_effect(inst):
                stack.append(n)
        while stack:
            n = stack.pop()
            if n in live:
                continue
            live.add(n)
            stack.extend(self._insts[n].operands)
        dead = [n for n in reversed(self._order) if n not in live]
        for n in dead:
            self.remove(n)
        return dead

    def freeze(self) -> Computation:
        return Computation(self.name, tuple(self._insts[n] for n in self._order), self.root_name, self.is_entry,
                           self.extra, self.line)  # fmt: skip


class ModuleEdit:
    """A module's computations as `ComputationEdit`s, and the names in use across it."""

    def __init__(self, module: HloModule) -> None:
        self._module = module
        self.names: set[str] = {i.name for c in module.computations for i in c}
        self.computations: dict[str, ComputationEdit] = {}
        for comp in module.computations:
            self.computations[comp.name] = ComputationEdit(comp, self)
        self.entry_name = module.entry_name
        self._counters: dict[str, itertools.count[int]] = {}

    def __getitem__(self, name: str) -> ComputationEdit:
        return self.computations[name]

    @property
    def entry(self) -> ComputationEdit:
        return self.computations[self.entry_name]

    def fresh_name(self, base: str) -> str:
        """`base.N` with the smallest N not used yet, as XLA's name uniquer numbers clones."""
        stem = _NUMBERED.sub(r"\1", base)
        counter = self._counters.setdefault(stem, itertools.count(1))
        while True:
            name = f"{stem}.{next(counter)}"
            if name not in self.names:
                self.names.add(name)
                return name

    def recreated(self, name: str) -> None:
        """XLA rebuilt this computation (a loop pass cloned it with a changed tuple, or sank constants
        into it): the rebuilt one joins the end of the module's computation list, as XLA's
        `AddEmbeddedComputation` appends it. Propagation visits computations in that list's order,
        and on a loop step the order decides which of two equally good shardings the carry gets."""
        self.computations[name] = self.computations.pop(name)

    def post_order(self) -> list[str]:
        """The computations callees first (XLA's `HloModule::MakeComputationPostOrder`): for each
        computation nothing calls, in list order, the computations it calls, depth first in
        instruction order, then itself. (XLA lists a While's body before its condition; the
        order between those two changes nothing the planner reads from this order: the Whiles
        loop-invariant motion collects, callees first.)"""
        called = {c for comp in self.computations.values() for i in comp for c in i.called_computations}
        order: list[str] = []
        seen: set[str] = set()

        def visit(name: str) -> None:
            for inst in self.computations[name]:
                for callee in inst.called_computations:
                    if callee not in seen and callee in self.computations:
                        seen.add(callee)
                        visit(callee)
                        order.append(callee)

        for name in list(self.computations):
            if name not in called and name not in seen:
                visit(name)
                seen.add(name)
                order.append(name)
        return order

    def remove_unreachable_computations(self) -> list[str]:
        reached: set[str] = set()
        stack = [self.entry_name]
        while stack:
            name = stack.pop()
            if name in reached:
                continue
            reached.add(name)
            for inst in self.computations[name]:
                stack.extend(inst.called_computations)
        gone = [n for n in self.computations if n not in reached]
        for n in gone:
            del self.computations[n]
        return gone

    def freeze(self) -> HloModule:
        return dataclasses.replace(self._module, computations=tuple(c.freeze() for c in self.computations.values()))


# -- instruction builders, in XLA's spelling ------------------------------------------------------------


def get_tuple_element(
    name: str, tuple_name: str, shape: TupleShape, index: int, like: Instruction | None = None
) -> Instruction:
    """`name = element get-tuple-element(tuple_name), index=index`, with `like`'s metadata if given."""
    attributes = [Attribute("index", index, str(index))]
    if like is not None and like.has_attr("metadata"):
        attributes += [a for a in like.attributes if a.key == "metadata"]
    return Instruction(name, "get-tuple-element", shape.elements[index], (tuple_name,), tuple(attributes))


def tuple_of(name: str, operands: tuple[str, ...], shapes: tuple[Shape, ...]) -> Instruction:
    return Instruction(name, "tuple", TupleShape(shapes), operands)


def with_attribute(inst: Instruction, key: str, value: object, text: str) -> Instruction:
    """`inst` with attribute `key` set (replaced in place, or appended)."""
    attrs = list(inst.attributes)
    for k, a in enumerate(attrs):
        if a.key == key:
            attrs[k] = Attribute(key, value, text)
            break
    else:
        attrs.append(Attribute(key, value, text))
    return dataclasses.replace(inst, attributes=tuple(attrs))


# Ops XLA never removes as dead code, whatever reads them (HloInstruction::HasSideEffect).
_SIDE_EFFECTS = frozenset(
    "send send-done recv recv-done outfeed infeed trace rng rng-get-and-update-state all-reduce-start "
    "collective-permute-start async-start async-done".split()
)


def has_side_effect(inst: Instruction) -> bool:
    if inst.opcode in _SIDE_EFFECTS:
        return True
    if inst.opcode == "custom-call":
        return bool(inst.attr("custom_call_has_side_effect"))
    return False

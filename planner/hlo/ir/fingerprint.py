"""A module's structure, hash-consed: two modules with equal digests compute the same thing the same way.

Names, layouts and metadata are left out, and so is tuple plumbing: `get-tuple-element(tuple(a,
b)), index=1` is `b` itself. That is what differs between a module and the same module after a trip
through another representation (StableHLO flattens tuples and renames everything), and none of it
changes what GSPMD decides. Everything else is kept: opcode, shape, literal, parameter number,
every attribute (sharding included), operands by their own structure, and called computations by
theirs.

Worked example: in `ENTRY { a = f32[4] parameter(0); b = f32[4] negate(a); ROOT t = (f32[4]) tuple(b) }`
`a` gets id 0 from `("parameter", "f32[4]", None, 0, (), ())`, `b` id 1 from `("negate", "f32[4]",
None, None, (), (0,))`, `t` id 2, and the computation id 3 from `t`'s id and its dead instructions
(none). The same module printed with other names and layouts, through the same table, gets the same
ids; a `negate` whose operand is another parameter does not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable

from planner.hlo.ir.attributes import ComputationRefs
from planner.hlo.ir.module import Attribute, Computation, HloModule, Instruction

# Attributes with no effect on what XLA computes or how it shards it.
UNCOMPARED_KEYS = frozenset({"metadata"})
# Instructions that read or feed nothing on their own when dead: not part of a computation's identity.
_PLUMBING = frozenset({"parameter", "tuple", "get-tuple-element"})


class Fingerprint:
    """The ids of a module's computations and instructions, interned in a `table` fingerprints share.

    A computation's id is its root's id and the ids of its dead instructions (those the root does not
    read, plumbing aside): a side-effecting one still runs, and XLA keeps it.
    """

    def __init__(self, module: HloModule, table: dict[Hashable, int]) -> None:
        self.module = module
        self._table = table
        self._computations: dict[str, int] = {}
        self._ids: dict[tuple[str, str], int] = {}
        self._labels: dict[int, str] = {}
        self.digest = self._computation(module.entry_name)

    def unmatched(self, other: Fingerprint, limit: int = 5) -> list[str]:
        """Instructions here with no equal there whose operands all have one: where the modules part."""
        theirs = set(other._ids.values())
        lowest = set()
        for (comp_name, inst_name), ident in self._ids.items():
            if ident in theirs:
                continue
            comp = self.module.computation(comp_name)
            inst = comp[inst_name]
            if inst.opcode == "tuple" and _only_taken_apart(comp, inst):
                continue  # plumbing the other side may not have: its elements are what count
            if all(self._ids[(comp_name, o)] in theirs for o in inst.operands):
                lowest.add(self._labels[ident])
        return sorted(lowest)[:limit]

    def _intern(self, key: Hashable, label: str) -> int:
        ident = self._table.setdefault(key, len(self._table))
        self._labels.setdefault(ident, label)
        return ident

    def _computation(self, name: str) -> int:
        if name not in self._computations:
            comp = self.module.computation(name)
            for inst in comp:
                self._instruction(comp, inst)
            live = _live(comp)
            dead = Counter(
                self._ids[(name, inst.name)] for inst in comp if inst.name not in live and inst.opcode not in _PLUMBING
            )
            key = ("computation", self._ids[(name, comp.root_name)], frozenset(dead.items()))
            self._computations[name] = self._intern(key, f"computation {name}")
        return self._computations[name]

    def _instruction(self, comp: Computation, inst: Instruction) -> int:
        """The id of `inst`, its operands' first; with a stack, since loop bodies run thousands deep."""
        stack = [inst]
        while stack:
            top = stack[-1]
            if (comp.name, top.name) in self._ids:
                stack.pop()
                continue
            pending = [comp[o] for o in top.operands if (comp.name, o) not in self._ids]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            self._ids[(comp.name, top.name)] = self._key(comp, top)
        return self._ids[(comp.name, inst.name)]

    def _key(self, comp: Computation, inst: Instruction) -> int:
        element = _element_read(comp, inst)
        if element is not None:
            return self._ids[(comp.name, element)]
        operands = tuple(self._ids[(comp.name, o)] for o in inst.operands)
        attrs = tuple(sorted((a.key, self._attribute(a)) for a in inst.attributes if a.key not in UNCOMPARED_KEYS))
        shape = inst.shape.to_text(False)
        key = (inst.opcode, shape, inst.literal, inst.parameter_number, attrs, operands)
        return self._intern(key, f"{inst.name} = {shape} {inst.opcode} in {comp.name}")

    def _attribute(self, attr: Attribute) -> Hashable:
        if isinstance(attr.value, ComputationRefs):
            return tuple(self._computation(name) for name in attr.value.names)
        try:
            hash(attr.value)
        except TypeError:
            return attr.text
        return attr.value


def _element_read(comp: Computation, inst: Instruction) -> str | None:
    """For `get-tuple-element(tuple(...))` (neither annotated) the element it reads, else None."""
    if inst.opcode != "get-tuple-element" or inst.sharding is not None:
        return None
    source = comp[inst.operands[0]]
    if source.opcode != "tuple" or source.sharding is not None:
        return None
    return source.operands[inst.attr("index")]  # type: ignore[no-any-return]


def _only_taken_apart(comp: Computation, inst: Instruction) -> bool:
    return inst.name != comp.root_name and all(_element_read(comp, comp[u]) is not None for u in comp.users(inst.name))


def _live(comp: Computation) -> set[str]:
    """What the root reads, directly or not, with tuple plumbing seen through: a tuple read for one element
    keeps only that element alive (the other elements of an inlined call's result tuple may be dead)."""
    live: set[str] = set()
    pending = [comp.root_name]
    while pending:
        name = pending.pop()
        if name in live:
            continue
        live.add(name)
        inst = comp[name]
        element = _element_read(comp, inst)
        pending.extend((element,) if element is not None else inst.operands)
    return live

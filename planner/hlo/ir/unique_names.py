"""Instruction names made unique across the module, as XLA's parser leaves them.

HLO text scopes instruction names by computation: XLA's own tests reuse `p` or `result` in a body, its
condition and the entry. XLA's parser accepts that, and adding each computation to the module renames
every instruction through one `NameUniquer` (hlo_module.cc, `AddComputationInternal` with
`uniquify_identifiers`), so a module never holds two instructions of one name. The planner looks
instructions up by name module-wide; it renames the same way.

`NameUniquer::GetUniqueName` splits a numeric suffix off (`add.3` -> root `add`, id 3; `result` -> root
`result`, no suffix, id 0) and registers the id under the root: an id not taken yet is kept, a taken one
is replaced by the smallest id above the root's counter that is free. A name keeps its text when its id
was free (a suffixless name when that id is 0). Example, computations in text order: the body's
`result` stays `result`; the condition's `result` finds id 0 taken and becomes `result.1`; the entry's
`result` then becomes `result.2`, and an `add.1` after an `add.1` becomes `add.2`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from planner.hlo.ir.attributes import Raw
from planner.hlo.ir.module import Attribute, Computation, Instruction

_SUFFIX = re.compile(r"^(.+)\.(\d+)$")
_NAME_TOKEN = re.compile(r"%?[A-Za-z_][\w.\-]*")


class _IdsOfRoot:
    """XLA's SequentialIdGenerator: ids handed out under one root name."""

    def __init__(self) -> None:
        self.used: set[int] = set()
        self.next = 0

    def register(self, wanted: int) -> int:
        if wanted not in self.used:
            self.used.add(wanted)
            return wanted
        while self.next in self.used:
            self.next += 1
        self.used.add(self.next)
        self.next += 1
        return self.next - 1


def repeated_names(computations: Sequence[Computation]) -> bool:
    seen: set[str] = set()
    for comp in computations:
        for inst in comp.instructions:
            if inst.name in seen:
                return True
            seen.add(inst.name)
    return False


def uniquify_instruction_names(computations: Sequence[Computation]) -> tuple[Computation, ...]:
    """`computations` (in text order) with every instruction name unique module-wide, XLA's way."""
    ids: dict[str, _IdsOfRoot] = {}

    def unique(name: str) -> str:
        m = _SUFFIX.match(name)
        root, wanted = (m.group(1), int(m.group(2))) if m else (name, 0)
        given = ids.setdefault(root, _IdsOfRoot()).register(wanted)
        return root if given == 0 and m is None else f"{root}.{given}"

    renamed: list[Computation] = []
    for comp in computations:
        names = {inst.name: unique(inst.name) for inst in comp.instructions}
        if all(old == new for old, new in names.items()):
            renamed.append(comp)
            continue
        instructions = tuple(_renamed(inst, names) for inst in comp.instructions)
        renamed.append(dataclasses.replace(comp, instructions=instructions, root_name=names[comp.root_name]))
    return tuple(renamed)


def _renamed(inst: Instruction, names: dict[str, str]) -> Instruction:
    attributes = tuple(
        _predecessors_renamed(a, names) if a.key == "control-predecessors" else a for a in inst.attributes
    )
    return dataclasses.replace(
        inst, name=names[inst.name], operands=tuple(names.get(o, o) for o in inst.operands), attributes=attributes
    )


def _predecessors_renamed(attribute: Attribute, names: dict[str, str]) -> Attribute:
    def one(m: re.Match[str]) -> str:
        token = m.group(0)
        bare = token.lstrip("%")
        return token[: len(token) - len(bare)] + names.get(bare, bare)

    text = _NAME_TOKEN.sub(one, attribute.text)
    return Attribute(attribute.key, Raw(text), text)


def fresh_name(base: str, taken: set[str]) -> str:
    """`base`, or `base.1`, `base.2`, ... the first not in `taken`; recorded in `taken`."""
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}.{k}"
    taken.add(name)
    return name

"""One computation per sequential call site, as XLA's FlattenCallGraph leaves a module before it inlines calls.

A computation run in its caller's place (a While's body and condition, a conditional's branches, a call's
callee) may be named by several call sites: JAX emits one `searchsorted` for every place a jitted
function calls it, each with its While inside. Every pass after this one rewrites a loop's body for
that loop alone (carried elements added, removed or sunk), so XLA first gives each such call site its
own copy; computations applied element by element (a reduce's `to_apply`, a fusion's) stay shared.

A copy is named as XLA's `HloComputation::Clone` names it: `NAME.clone`, its instructions
`NAME.clone`, with `.1`, `.2`, ... where the name is taken.
"""

from __future__ import annotations

import dataclasses

from planner.hlo.ir.attributes import ComputationRefs
from planner.hlo.ir.module import Attribute, Computation, HloModule
from planner.hlo.ir.unique_names import fresh_name

# The attributes through which an opcode runs a computation in its caller's place.
_SEQUENTIAL = {
    "while": ("body", "condition"),
    "conditional": ("branch_computations", "true_computation", "false_computation"),
    "call": ("to_apply",),
}


def flatten_call_graph(module: HloModule) -> HloModule:
    """`module` with every computation reached from more than one sequential call site copied once per extra site."""
    computations = {c.name: c for c in module.computations}
    order = [c.name for c in module.computations]
    taken = set(computations) | {i.name for c in module.computations for i in c}
    claimed = {module.entry_name}
    pending = [module.entry_name]
    while pending:
        name = pending.pop()
        comp = computations[name]
        rewritten = []
        for inst in comp:
            attributes = []
            for a in inst.attributes:
                if a.key in _SEQUENTIAL.get(inst.opcode, ()) and isinstance(a.value, ComputationRefs):
                    refs = []
                    for callee in a.value.names:
                        if callee in claimed:
                            clone = _clone(computations[callee], taken)
                            computations[clone.name] = clone
                            order.append(clone.name)
                            callee = clone.name
                        claimed.add(callee)
                        pending.append(callee)
                        refs.append(callee)
                    if tuple(refs) != a.value.names:
                        a = Attribute(a.key, ComputationRefs(tuple(refs)), _refs_text(a, refs))
                attributes.append(a)
            attributes_tuple = tuple(attributes)
            rewritten.append(inst if attributes_tuple == inst.attributes else
                             dataclasses.replace(inst, attributes=attributes_tuple))  # fmt: skip
        if any(new is not old for new, old in zip(rewritten, comp.instructions)):
            computations[name] = dataclasses.replace(comp, instructions=tuple(rewritten))
    if len(order) == len(module.computations):  # no call site needed a copy
        return module
    return dataclasses.replace(module, computations=tuple(computations[n] for n in order))


def _clone(comp: Computation, taken: set[str]) -> Computation:
    """A copy of `comp` under fresh names; the computations it calls are copied when it is visited."""
    renamed = {inst.name: fresh_name(f"{inst.name}.clone", taken) for inst in comp}
    instructions = tuple(
        dataclasses.replace(inst, name=renamed[inst.name], operands=tuple(renamed.get(o, o) for o in inst.operands))
        for inst in comp
    )
    return dataclasses.replace(comp, name=fresh_name(f"{comp.name}.clone", taken), instructions=instructions,
                               root_name=renamed[comp.root_name], is_entry=False)  # fmt: skip


def _refs_text(attribute: Attribute, names: list[str]) -> str:
    """The attribute as HLO text writes it: `%name`, or `{%a, %b}` for a list."""
    listed = ", ".join(f"%{n}" for n in names)
    return f"{{{listed}}}" if attribute.text.lstrip().startswith("{") else listed

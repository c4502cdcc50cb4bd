"""Call inlining, as XLA's CallInliner runs it before sharding propagation.

torch_xla and JAX dumps taken before optimisation still hold `call`
instructions; XLA inlines them before its propagation pass, and that changes
what propagation sees (a callee used at two call sites is cloned twice). This
module does the same so propagation runs on the module XLA actually shards.

Names of clones: a callee with one call site keeps its instruction names; a
callee with several call sites gets `name-in-call_site` (nested inlining
extends it: `name-in-inner-in-outer`), which stays a valid HLO name. The
returned aliases map the names that disappear (the call, the callee's
parameters) to what replaced them, and the path notation `name@call/outer`
(how XLA's inlined clones are traced back to the dump) to the clone.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable

from planner.hlo.ir.module import Computation, HloModule, Instruction


@dataclasses.dataclass(frozen=True)
class InlinedModule:
    module: HloModule
    # Disappeared name -> name now holding its value.
    aliases: dict[str, str]


def inline_calls(module: HloModule, which: Callable[[Instruction], bool] | None = None) -> InlinedModule:
    """Inline the calls `which` picks (default: those XLA's CallInliner inlines before propagation)."""
    picked = which or inlineable
    call_sites = Counter(
        callee for comp in module.computations for inst in comp if picked(inst) for callee in inst.called_computations
    )
    if not call_sites:
        return InlinedModule(module, {})
    aliases: dict[str, str] = {}
    done: dict[str, Computation] = {}
    # Callees first: a computation is inlined into its callers only after its own calls are.
    for comp in _callees_first(module):
        done[comp.name] = _inline_into(comp, done, call_sites, aliases, picked)
    still_called = {name for c in done.values() for inst in c for name in inst.called_computations}
    kept = tuple(done[c.name] for c in module.computations if c.name == module.entry_name or c.name in still_called)
    return InlinedModule(dataclasses.replace(module, computations=kept), resolve_chains(aliases))


def inlineable(inst: Instruction) -> bool:
    """A call XLA's CallInliner inlines before propagation: every call but one whose `inlineable` attribute says
    otherwise (a shard_map's body in JAX's Shardy round trip: `"false"` from jax 0.7.1, `"xla_late"` from jax
    0.12; XLA's dump before `shardy-xla` still shows either as a call)."""
    if inst.opcode != "call":
        return False
    attrs = inst.attr("frontend_attributes")
    return attrs is None or attrs.get("inlineable") in (None, "true")


def resolve_chains(aliases: dict[str, str]) -> dict[str, str]:
    """Each retired name to the name that holds its value in the end: a callee parameter may alias a
    parameter of an outer callee that was inlined too, a name one pass retired may point at one a
    later pass retired."""
    resolved = {}
    for name, target in aliases.items():
        seen = {name}
        while target in aliases and target not in seen:
            seen.add(target)
            target = aliases[target]
        resolved[name] = target
    return resolved


def _callees_first(module: HloModule) -> list[Computation]:
    order: list[Computation] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        comp = module.computation(name)
        for inst in comp:
            for callee in inst.called_computations:
                visit(callee)
        order.append(comp)

    for comp in module.computations:
        visit(comp.name)
    return order


def _inline_into(
    comp: Computation,
    done: dict[str, Computation],
    call_sites: Counter[str],
    aliases: dict[str, str],
    picked: Callable[[Instruction], bool],
) -> Computation:
    if not any(picked(inst) for inst in comp):
        return comp
    rename: dict[str, str] = {}
    out: list[Instruction] = []
    root = comp.root_name
    for inst in comp:
        operands = tuple(rename.get(o, o) for o in inst.operands)
        if not picked(inst):
            out.append(dataclasses.replace(inst, operands=operands) if operands != inst.operands else inst)
            continue
        callee = done[inst.called_computations[0]]
        shared = call_sites[callee.name] > 1
        local: dict[str, str] = {}
        for param in callee.parameters:
            local[param.name] = operands[param.parameter_number or 0]
            aliases.setdefault(_path_name(param.name, inst.name, shared), local[param.name])
        for body_inst in callee:
            if body_inst.opcode == "parameter":
                continue
            name = _clone_name(body_inst.name, inst.name, shared)
            local[body_inst.name] = name
            if shared:
                aliases[_path_name(_path_of(body_inst.name, aliases), inst.name, shared)] = name
            out.append(
                dataclasses.replace(body_inst, name=name, operands=tuple(local.get(o, o) for o in body_inst.operands))
            )
        result = local[callee.root_name]
        rename[inst.name] = result
        aliases[inst.name] = result
        if inst.name == root:
            root = result
    return dataclasses.replace(comp, instructions=tuple(out), root_name=root)


def _clone_name(name: str, call: str, shared: bool) -> str:
    """A single call site moves the callee's instructions under their own names."""
    return f"{name}-in-{call}" if shared else name


def _path_name(name: str, call: str, shared: bool) -> str:
    """`name@call`, or `name@inner/outer` for a clone of a clone."""
    if not shared:
        return name
    base, _, path = name.partition("@")
    return f"{base}@{path}/{call}" if path else f"{name}@{call}"


def _path_of(name: str, aliases: dict[str, str]) -> str:
    """The path notation of an earlier clone's name, if it is one."""
    for path, clone in aliases.items():
        if clone == name and "@" in path:
            return path
    return name

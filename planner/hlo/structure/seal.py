"""Hide every instruction of a module from MLIR's canonicalizer, where XLA cannot see the difference.

jaxlib compiles only StableHLO, and its way back to HLO (`Client.compile` -> `MlirToXlaComputation`
-> `StablehloToMhlo(module, run_canonicalizer=true)`, xla/hlo/translate/stablehlo.cc; libtpu's
compiler behind the PJRT C API does the same) runs MLIR's canonicalizer over every function, with no
option to skip it. The canonicalizer rewrites across instructions: `slice(concatenate(...))` becomes
the matching operand, reshape and transpose chains merge, `broadcast(constant)` becomes a splat
constant every user shares, and a While element the body returns unchanged becomes an implicit
capture that the exporter appends after the carried elements (the loop tuple comes back reordered).
GSPMD decides differently on what comes back: on the bundled torch_xla step the stacked gradients
end up 8-way sharded where torch_xla's own compile keeps them 2-way, which hides exactly the
under-sharding the planner is for.

The canonicalizer does not look through `func.call`, and XLA's call-inliner removes calls before
sharding propagation (XLA:CPU right after flatten-call-graph; XLA:TPU after expanders and dead code
elimination that treat an instruction the same wherever it sits). So two passes put calls where
the canonicalizer would rewrite, and the module that reaches propagation is the one given:

    SealInstructions     each instruction of a control-flow computation in a computation of its own
    SealLoopPassThrough  each While element the body passes through goes through an identity call

What a call cannot hide (an op that folds alone, a broadcast written as a reshape) is the MLIR
side's business (`planner.plan.compilers.stablehlo`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from planner.errors import UnfaithfulConversion
from planner.hlo.ir.attributes import ComputationRefs
from planner.hlo.ir.module import Attribute, Computation, HloModule, Instruction

# Opcodes the importer turns into plumbing (parameters, tuple flattening) or into control flow whose
# own computations are sealed: a call around them would hide nothing from the canonicalizer.
UNSEALED_OPCODES = frozenset({"parameter", "get-tuple-element", "tuple", "while", "call", "conditional"})
# The attributes naming the computations an instruction runs as control flow (not a reducer's region).
_CONTROL_FLOW_KEYS = {
    "call": ("to_apply",),
    "while": ("body", "condition"),
    "conditional": ("branch_computations", "true_computation", "false_computation"),
}


@dataclass(frozen=True)
class Sealing:
    """One sealing pass's result: the module after it and how many calls it added."""

    module: HloModule
    num_calls: int


@dataclass(frozen=True)
class SealedModule:
    """A module whose instructions no canonicalization can reach, and what it took."""

    module: HloModule
    # Instructions moved into computations of their own (SealInstructions).
    num_sealed: int
    # While elements routed through an identity call (SealLoopPassThrough).
    num_pass_through: int


@dataclass(frozen=True)
class SealInstructions:
    """Each instruction of a control-flow computation moves into a computation of its own, called once.

    Worked example: `%m = f32[8]{0} multiply(%a, %b)` becomes `%m = f32[8]{0} call(%a, %b),
    to_apply=%m.sealed`, where `%m.sealed (p0: f32[8], p1: f32[8]) -> f32[8]` holds
    `ROOT %m.sealed.inner = f32[8]{0} multiply(%m.sealed.p0, %m.sealed.p1)`. One parameter per operand
    position, so `multiply(%x, %x)` keeps two operands the canonicalizer cannot prove equal. The
    computations an instruction applies (a reduce's or a scatter's `to_apply`) stay as they are: they
    are regions of the sealed instruction, and nothing in them crosses into the caller.

    An instruction with a sharding (torch_xla's `Sharding` custom-calls) stays where it is: the
    exporter would put the callee's result sharding on the call as a one-element tuple and a
    get-tuple-element, both annotated, which XLA keeps after inlining (user shardings the original
    never had; XLA:CPU aborts on them). Left in place it is still out of reach: its operands and its
    users are calls.
    """

    name: str = "seal-instructions"

    def apply(self, module: HloModule) -> Sealing:
        names = _Names(module)
        added: list[Computation] = []
        rewritten: dict[str, Computation] = {}
        for name in control_flow_computations(module):
            comp = module.computation(name)
            kept: list[Instruction] = []
            for inst in comp:
                if inst.opcode in UNSEALED_OPCODES or inst.sharding is not None:
                    kept.append(inst)
                    continue
                target = names.fresh(f"{inst.name}.sealed")
                params = tuple(
                    _parameter(names.fresh(f"{target}.p{k}"), k, comp[operand])
                    for k, operand in enumerate(inst.operands)
                )
                inner = dataclasses.replace(
                    inst, name=names.fresh(f"{target}.inner"), operands=tuple(p.name for p in params)
                )
                added.append(Computation(name=target, instructions=(*params, inner), root_name=inner.name))
                kept.append(_call(inst.name, inst, inst.operands, target))
            rewritten[name] = dataclasses.replace(comp, instructions=tuple(kept))
        return Sealing(_with_computations(module, added, rewritten), len(added))


@dataclass(frozen=True)
class SealLoopPassThrough:
    """A While body's root element `get-tuple-element(param), index=i`, at position i, goes through a call.

    mhlo's While canonicalization turns an element the body returns unchanged into an implicit
    capture, and the exporter appends implicit captures after the carried elements: a 41-element
    loop comes back with its stacked weights moved to the end, and GSPMD partitions it into other
    shapes. A call to an identity computation is not the block argument, so nothing is captured;
    XLA's call-inliner replaces the call by its operand and the body's root is the original's again.
    An element that reaches the root through `get-tuple-element(tuple(...))` pairs (an inlined call's
    result) passes through all the same. A body whose root is not a tuple instruction has no elements
    to route this way: it is refused.
    """

    name: str = "seal-loop-pass-through"

    def apply(self, module: HloModule) -> Sealing:
        names = _Names(module)
        added: list[Computation] = []
        rewritten: dict[str, Computation] = {}
        bodies = dict.fromkeys(inst.attr("body").names[0] for comp in module.computations for inst in comp
                               if inst.opcode == "while")  # fmt: skip
        for name in bodies:
            body = module.computation(name)
            if body.root.opcode != "tuple":
                raise UnfaithfulConversion(f"While body {name} returns a {body.root.opcode}, not a tuple")
            (param,) = body.parameters
            operands = list(body.root.operands)
            calls: list[Instruction] = []
            for i, operand in enumerate(body.root.operands):
                element = body[operand]
                source = _through_tuples(body, element)
                if not (source.opcode == "get-tuple-element" and source.operands == (param.name,)
                        and source.attr("index") == i):  # fmt: skip
                    continue
                target = names.fresh(f"{name}.pass_through{i}")
                identity = _parameter(names.fresh(f"{target}.p0"), 0, element)
                added.append(Computation(name=target, instructions=(identity,), root_name=identity.name))
                calls.append(_call(names.fresh(f"{operand}.pass_through{i}"), element, (operand,), target))
                operands[i] = calls[-1].name
            if calls:
                others = tuple(inst for inst in body if inst.name != body.root_name)
                root = dataclasses.replace(body.root, operands=tuple(operands))
                rewritten[name] = dataclasses.replace(body, instructions=(*others, *calls, root))
        return Sealing(_with_computations(module, added, rewritten), len(added))


# In this order: SealInstructions leaves get-tuple-elements in place, so pass-through elements stay visible.
SEAL_PASSES = (SealInstructions(), SealLoopPassThrough())


def seal(module: HloModule) -> SealedModule:
    num_calls = []
    for seal_pass in SEAL_PASSES:
        sealing = seal_pass.apply(module)
        module = sealing.module
        num_calls.append(sealing.num_calls)
    num_sealed, num_pass_through = num_calls
    return SealedModule(module, num_sealed, num_pass_through)


def control_flow_computations(module: HloModule) -> tuple[str, ...]:
    """The entry and every computation reached from it through call, while and conditional, entry first."""
    found = {module.entry_name: None}
    pending = [module.entry_name]
    while pending:
        for inst in module.computation(pending.pop()):
            for attr in inst.attributes:
                if attr.key in _CONTROL_FLOW_KEYS.get(inst.opcode, ()):
                    for callee in attr.value.names:
                        if callee not in found:
                            found[callee] = None
                            pending.append(callee)
    return tuple(found)


class _Names:
    """Names free in the module, computations and instructions alike (HLO text shares one namespace)."""

    def __init__(self, module: HloModule) -> None:
        self._used = {c.name for c in module.computations} | {i.name for c in module.computations for i in c}

    def fresh(self, name: str) -> str:
        candidate, k = name, 0
        while candidate in self._used:
            k += 1
            candidate = f"{name}.{k}"
        self._used.add(candidate)
        return candidate


def _through_tuples(comp: Computation, inst: Instruction) -> Instruction:
    """What `inst` is once `get-tuple-element(tuple(...))` pairs are folded, as the importer's tuple flattening does.

    An inlined call leaves such pairs in a loop body (`tuple` at the callee's root, get-tuple-elements
    at the call's users); StableHLO has no tuples there, so an element read from the body's parameter
    and passed through such a pair is a pass-through all the same.
    """
    while inst.opcode == "get-tuple-element":
        source = comp[inst.operands[0]]
        if source.opcode != "tuple":
            break
        inst = comp[source.operands[inst.attr("index")]]
    return inst


def _parameter(name: str, number: int, like: Instruction) -> Instruction:
    return Instruction(name=name, opcode="parameter", shape=like.shape, operands=(), parameter_number=number)


def _call(name: str, like: Instruction, operands: Iterable[str], target: str) -> Instruction:
    to_apply = Attribute("to_apply", ComputationRefs((target,)), f"%{target}")
    return Instruction(name=name, opcode="call", shape=like.shape, operands=tuple(operands), attributes=(to_apply,))


def _with_computations(module: HloModule, added: list[Computation], rewritten: dict[str, Computation]) -> HloModule:
    """XLA's parser wants a computation defined before its first use: regions, then the added ones, then callers.

    Regions (reducers, comparators) are called only from instructions, which the added computations
    now hold; control-flow computations keep their order among themselves, which already had callees
    first.
    """
    flow = set(control_flow_computations(module))
    regions = [c for c in module.computations if c.name not in flow]
    callers = [rewritten.get(c.name, c) for c in module.computations if c.name in flow]
    return dataclasses.replace(module, computations=(*regions, *added, *callers))

"""While loops: body, condition, carried tuple and trip count.

XLA records a known trip count in the While's backend_config
(`{"known_trip_count":{"n":"8"}}`); torch_xla and JAX dumps taken before
optimisation do not, so the count is also read off the loop's own structure,
the way XLA's while-loop analysis does it for the common scan shape:

    condition: ROOT compare(get-tuple-element(param), index=i), constant(N)), direction=LT
    body:      tuple element i is add(get-tuple-element(param), index=i), constant(1))
    init:      element i of the While's operand is constant(K)

gives N - K iterations. XLA:TPU carries a 64-bit counter as two u32 halves (see
`prepare.x64_rewriter`); the planner's rewrite reads them back as `X64Combine(low, high)` and
returns the low word as `convert(add(...))` to u32, which this reads as the counter itself at the
low half's index.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape, TupleShape

# How far to follow copies, converts and call parameters back to a constant.
_MAX_TRACE = 16


@dataclass(frozen=True, slots=True)
class WhileLoop:
    """A While instruction with its body, condition and carried tuple."""

    instruction: Instruction
    computation: str
    body: str
    condition: str
    trip_count: int | None
    # Where the trip count comes from: "backend_config", "loop structure" or None.
    trip_count_source: str | None

    @property
    def name(self) -> str:
        return self.instruction.name

    @property
    def tuple_arity(self) -> int:
        shape = self.instruction.shape
        return len(shape.elements) if isinstance(shape, TupleShape) else 1


def while_loops(module: HloModule) -> tuple[WhileLoop, ...]:
    loops = []
    for comp in module.computations:
        for inst in comp.instructions:
            if inst.opcode != "while":
                continue
            body = inst.attr("body").names[0]
            condition = inst.attr("condition").names[0]
            count, source = trip_count(module, comp, inst)
            loops.append(WhileLoop(inst, comp.name, body, condition, count, source))
    return tuple(loops)


def trip_count(module: HloModule, comp: Computation, inst: Instruction) -> tuple[int | None, str | None]:
    """The While's trip count and where it comes from: "backend_config", "loop structure" or None."""
    count = known_trip_count(inst)
    if count is not None:
        return count, "backend_config"
    body, condition = inst.attr("body").names[0], inst.attr("condition").names[0]
    count = _trip_count_from_structure(module, comp, inst, body, condition)
    return count, "loop structure" if count is not None else None


def known_trip_count(inst: Instruction) -> int | None:
    """The trip count XLA recorded in a While's backend_config, if any."""
    config = inst.attr("backend_config")
    if isinstance(config, dict):
        count = config.get("known_trip_count")
        if isinstance(count, dict) and str(count.get("n", "")).isdigit():
            return int(count["n"])
    return None


def _trip_count_from_structure(module: HloModule, comp: Computation, loop: Instruction, body_name: str,
                               condition_name: str) -> int | None:  # fmt: skip
    condition = module.computation(condition_name)
    root = condition.root
    if root.opcode != "compare" or root.attr("direction") not in ("LT", "LE"):
        return None
    counter, bound = condition.operands(root)
    index = _tuple_index_of_parameter(condition, counter)
    limit = _integer_constant(bound)
    if index is None or limit is None:
        return None
    if not _increments_by_one(module.computation(body_name), index):
        return None
    start = _trace_constant(module, comp, loop, index)
    if start is None:
        return None
    count = limit - start + (1 if root.attr("direction") == "LE" else 0)
    return max(count, 0)


def _tuple_index_of_parameter(comp: Computation, inst: Instruction) -> int | None:
    if _x64_call(inst, "X64Combine") and len(inst.operands) == 2:
        low, high = (_tuple_index_of_parameter(comp, comp[o]) for o in inst.operands)
        return low if low is not None and high == low + 1 else None
    if inst.opcode != "get-tuple-element":
        return None
    source = comp[inst.operands[0]]
    return inst.attr("index") if source.opcode == "parameter" else None


def _increments_by_one(body: Computation, index: int) -> bool:
    root = body.root
    if root.opcode != "tuple" or index >= len(root.operands):
        return False
    step = body[root.operands[index]]
    if _low_word(body, step):
        step = body[step.operands[0]]
    if step.opcode != "add":
        return False
    a, b = body.operands(step)
    return (_tuple_index_of_parameter(body, a) == index and _integer_constant(b) == 1) or (
        _tuple_index_of_parameter(body, b) == index and _integer_constant(a) == 1
    )


def _x64_call(inst: Instruction, target: str) -> bool:
    return inst.opcode == "custom-call" and inst.attr("custom_call_target") == target


def _low_word(comp: Computation, inst: Instruction) -> bool:
    """`convert` of a 64-bit integer to u32: the low word of a split counter."""
    if inst.opcode != "convert" or not isinstance(inst.shape, ArrayShape) or inst.shape.element_type != "u32":
        return False
    operand = comp[inst.operands[0]].shape
    return isinstance(operand, ArrayShape) and operand.element_type in ("s64", "u64")


def _integer_constant(inst: Instruction) -> int | None:
    if inst.opcode != "constant" or inst.literal is None:
        return None
    try:
        return int(inst.literal)
    except ValueError:
        return None


def _trace_constant(module: HloModule, comp: Computation, loop: Instruction, index: int) -> int | None:
    """Follows element `index` of the loop's initial tuple back to a constant."""
    init = comp[loop.operands[0]]
    if init.opcode != "tuple":
        return None
    inst = comp[init.operands[index]]
    for _ in range(_MAX_TRACE):
        value = _integer_constant(inst)
        if value is not None:
            return value
        if inst.opcode in ("copy", "convert", "bitcast", "reshape"):
            inst = comp[inst.operands[0]]
            continue
        if inst.opcode == "parameter":
            caller = _single_call_site(module, comp.name)
            if caller is None:
                return None
            comp, call = caller
            inst = comp[call.operands[inst.parameter_number or 0]]
            continue
        return None
    return None


def _single_call_site(module: HloModule, callee: str) -> tuple[Computation, Instruction] | None:
    sites = [
        (comp, inst)
        for comp in module.computations
        for inst in comp.instructions
        if inst.opcode == "call" and callee in inst.called_computations
    ]
    return sites[0] if len(sites) == 1 else None


def invariant_elements(body: Computation) -> set[int]:
    """Carried elements the body returns exactly as it received them."""
    root = body.root
    if root.opcode != "tuple" or not body.parameters:
        return set()
    param = body.parameters[0].name
    return {
        i
        for i, operand in enumerate(root.operands)
        if body[operand].opcode == "get-tuple-element"
        and body[operand].operands[0] == param
        and body[operand].attr("index") == i
    }

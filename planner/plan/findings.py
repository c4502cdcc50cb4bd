"""Findings: buffers propagation leaves under-sharded, and conflicting shard groups.

A stacked gradient is a While-carried `[L, ...]` buffer that the loop updates
every iteration (it is not read-only) and that reaches the step's outputs: the
backward scan's accumulator. Its ideal is the sharding of the stacked
parameter of the same shape: a read-only `[L, ...]` element of a scan (the
forward `xs`), or the parameter spec a client manifest gives. Any other large
carried buffer is measured against its bytes spread over every device.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.hlo.ir import Computation, HloModule, Instruction
from planner.hlo.loops import while_loops
from planner.hlo.shapes import ArrayShape, TupleShape
from planner.memory.buffers import per_device_bytes
from planner.memory.model import _invariant_elements
from planner.propagation import PropagationResult
from planner.sharding.hlo_sharding import HloSharding

# Ops through which a carried value still *is* the value returned at the root.
_PASS_TO_OUTPUT = frozenset(
    "get-tuple-element tuple slice reshape bitcast copy convert transpose dynamic-slice add subtract multiply".split()
)


@dataclass(frozen=True)
class StackedParameter:
    """A read-only `[L, ...]` loop element: how the scanned weights are laid out."""

    loop: str
    index: int
    shape: ArrayShape
    sharding: HloSharding
    per_device_bytes: int


@dataclass(frozen=True)
class Finding:
    kind: str  # "stacked-gradient" | "large-buffer"
    loop: str
    index: int
    instruction: str  # the body root operand that produces the element each iteration
    shape: str
    current_sharding: str
    ideal_sharding: str | None
    per_device_bytes: int
    ideal_per_device_bytes: int
    waste_bytes: int
    matched_parameter: str | None  # "loop[index]" of the stacked parameter, or a manifest name

    @property
    def ratio(self) -> float:
        return self.per_device_bytes / max(self.ideal_per_device_bytes, 1)


def _leaf_shardings(sharding: HloSharding | None, count: int) -> list[HloSharding | None]:
    if sharding is None:
        return [None] * count
    return list(sharding.elements) if sharding.is_tuple else [sharding] * count


def stacked_parameters(module: HloModule, result: PropagationResult) -> list[StackedParameter]:
    found = []
    for loop in while_loops(module):
        if loop.trip_count is None or not isinstance(loop.instruction.shape, TupleShape):
            continue
        body = module.computation(loop.body)
        invariant = _invariant_elements(body)
        leaves = loop.instruction.shape.elements
        shardings = _leaf_shardings(result.sharding(loop.name), len(leaves))
        for i, (leaf, s) in enumerate(zip(leaves, shardings)):
            if i in invariant and _is_stacked(leaf, loop.trip_count) and s is not None:
                assert isinstance(leaf, ArrayShape)
                found.append(StackedParameter(loop.name, i, leaf, s, per_device_bytes(leaf, s)))
    return found


def _is_stacked(shape: object, trip_count: int) -> bool:
    return isinstance(shape, ArrayShape) and shape.rank >= 2 and shape.dims[0] == trip_count


def _reaches_root(module: HloModule, comp: Computation, inst: Instruction, index: int) -> bool:
    """Whether element `index` of a While's result flows to the computation's root."""
    frontier = [(inst.name, index)]
    seen: set[tuple[str, int]] = set()
    while frontier:
        name, element = frontier.pop()
        if (name, element) in seen:
            continue
        seen.add((name, element))
        if name == comp.root_name:
            return True
        for user_name in comp.users(name):
            user = comp[user_name]
            if user.opcode == "get-tuple-element":
                if element < 0 or user.attr("index") == element:
                    frontier.append((user_name, -1))
            elif user.opcode == "tuple":
                frontier.append((user_name, user.operands.index(name)))
            elif user.opcode in _PASS_TO_OUTPUT and element < 0:
                frontier.append((user_name, -1))
    return False


def buffer_findings(
    module: HloModule,
    result: PropagationResult,
    num_devices: int,
    threshold: float = 1.5,
    min_bytes: int = 1 << 20,
) -> list[Finding]:
    """Under-sharded carried buffers, stacked gradients first, largest waste first."""
    params = stacked_parameters(module, result)
    findings: list[Finding] = []
    for loop in while_loops(module):
        if loop.trip_count is None or not isinstance(loop.instruction.shape, TupleShape):
            continue
        comp = module.computation(loop.computation)
        body = module.computation(loop.body)
        invariant = _invariant_elements(body)
        leaves = loop.instruction.shape.elements
        shardings = _leaf_shardings(result.sharding(loop.name), len(leaves))
        root = body.root
        for i, (leaf, s) in enumerate(zip(leaves, shardings)):
            if i in invariant or not _is_stacked(leaf, loop.trip_count):
                continue
            assert isinstance(leaf, ArrayShape)
            current = per_device_bytes(leaf, s)
            producer = root.operands[i] if root.opcode == "tuple" else root.name
            same_shape = [p for p in params if p.shape.dims == leaf.dims]
            gradient = bool(same_shape) and _reaches_root(module, comp, loop.instruction, i)
            if gradient:
                best = min(same_shape, key=lambda p: p.per_device_bytes)
                ideal, ideal_sharding, match = (
                    best.per_device_bytes,
                    best.sharding.to_text(),
                    f"{best.loop}[{best.index}]",
                )
                kind = "stacked-gradient"
            else:
                ideal = -(-leaf.byte_size // num_devices)
                ideal_sharding, match, kind = None, None, "large-buffer"
            waste = current - ideal
            if current > ideal * threshold and waste >= min_bytes:
                findings.append(
                    Finding(
                        kind=kind,
                        loop=loop.name,
                        index=i,
                        instruction=producer,
                        shape=leaf.to_text(with_layout=False),
                        current_sharding=s.to_text() if s is not None else "{replicated}",
                        ideal_sharding=ideal_sharding,
                        per_device_bytes=current,
                        ideal_per_device_bytes=ideal,
                        waste_bytes=waste,
                        matched_parameter=match,
                    )
                )
    findings.sort(key=lambda f: (f.kind != "stacked-gradient", -f.waste_bytes))
    return findings

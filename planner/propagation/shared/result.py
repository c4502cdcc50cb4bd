"""What a propagation engine decides, in one form for every later stage: each instruction's sharding after the
pass, with the provenance of the decision, and the chain back to the annotation it came from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from planner.propagation.shared.graph import Provenance
from planner.sharding.hlo_sharding import HloSharding


@dataclass(frozen=True)
class PropagatedInstruction:
    name: str
    computation: str
    opcode: str
    sharding: HloSharding | None
    provenance: Provenance | None
    unknown_reason: str | None
    operands: tuple[str, ...] = ()
    tuple_index: int | None = None


@dataclass(frozen=True)
class ExplainStep:
    """One link of a provenance chain; `element` focuses a tuple on one of its elements."""

    instruction: PropagatedInstruction
    element: int | None

    @property
    def sharding(self) -> HloSharding | None:
        s = self.instruction.sharding
        if s is not None and s.is_tuple and self.element is not None and self.element < len(s.elements):
            return s.elements[self.element]
        return s


@dataclass(frozen=True)
class PropagationResult:
    """Shardings after propagation, by instruction name as XLA names them after the pass.

    Sharding custom-calls XLA turns into copies appear under their new names
    (`renamed` maps old to new); shard_as-only annotations are gone.
    """

    instructions: tuple[PropagatedInstruction, ...]
    renamed: Mapping[str, str]
    _by_name: dict[str, PropagatedInstruction] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for inst in self.instructions:
            self._by_name.setdefault(inst.name, inst)

    def __getitem__(self, name: str) -> PropagatedInstruction:
        return self._by_name[self.renamed.get(name, name)]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.renamed.get(name, name) in self._by_name

    def sharding(self, name: str) -> HloSharding | None:
        return self[name].sharding

    def shardings(self) -> dict[str, HloSharding]:
        return {i.name: i.sharding for i in self.instructions if i.sharding is not None}

    def explain(self, name: str) -> list[ExplainStep]:
        """The chain from `name` back to the annotation its sharding came from.

        Through tuples the chain follows one element: a get-tuple-element
        focuses its operand on the element it reads, and a tuple hands that
        element's question to the operand that supplies it.
        """
        chain: list[ExplainStep] = []
        seen: set[tuple[str, int | None]] = set()
        current: str | None = self.renamed.get(name, name)
        element: int | None = None
        while current is not None and current in self._by_name:
            if (current, element) in seen:
                # Around a loop: the carried value came in as the While's initial tuple.
                loop = next((step for step in chain if step.instruction.opcode == "while"), None)
                if loop is None or (loop.instruction.operands[0], loop.element) in seen:
                    break
                current, element = loop.instruction.operands[0], loop.element
                continue
            seen.add((current, element))
            inst = self._by_name[current]
            chain.append(ExplainStep(inst, element))
            sources = inst.provenance.sources if inst.provenance is not None else ()
            if inst.opcode == "get-tuple-element" and inst.operands:
                current, element = inst.operands[0], inst.tuple_index
            elif inst.opcode == "tuple" and element is not None and element < len(inst.operands):
                current, element = inst.operands[element], None
            else:
                current = sources[0] if sources else None
        return chain

    @property
    def unknown(self) -> dict[str, str]:
        return {i.name: i.unknown_reason for i in self.instructions if i.unknown_reason}

"""Findings: carried buffers propagation leaves under-sharded.

A stacked gradient (a backward loop's `[L, ...]` accumulator, see
`scan_pairs`) is measured against its parameter's sharding: per layer, the
gradient should be split exactly like the weight it updates; so is an
accumulated gradient (an outer loop's sum of it over microbatches). Any other large
`[L, ...]` buffer a loop writes (saved activations, residuals) is measured
against its bytes spread evenly over every device, the lower bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.hlo.ir.module import HloModule
from planner.hlo.ir.shapes import ArrayShape
from planner.hlo.structure.loops import invariant_elements
from planner.memory.buffers import per_device_bytes
from planner.mesh import Mesh
from planner.plan.diagnosis.output_pairs import OutputGradient
from planner.plan.diagnosis.scan_pairs import (
    AccumulatedGradient,
    StackedGradient,
    carried_loops,
    is_stacked,
    stacked_gradients,
)
from planner.plan.manifest import Manifest
from planner.propagation import PropagationResult
from planner.sharding.hlo_sharding import HloSharding

GRADIENT_OUTPUT = "gradient-output"
STACKED_GRADIENT = "stacked-gradient"
ACCUMULATED_GRADIENT = "accumulated-gradient"
# Kinds whose ideal is a parameter's sharding.
GRADIENT_KINDS = (STACKED_GRADIENT, ACCUMULATED_GRADIENT, GRADIENT_OUTPUT)


@dataclass(frozen=True)
class Finding:
    # "stacked-gradient" | "accumulated-gradient" | "large-buffer" | "gradient-output" (loop: the entry,
    # index: its output)
    kind: str
    loop: str
    index: int
    instruction: str  # the body root operand that produces the element each iteration
    shape: str
    current_sharding: str
    ideal_sharding: str | None
    per_device_bytes: int
    ideal_per_device_bytes: int
    waste_bytes: int
    matched_parameter: str | None  # the parameter's name (manifest) or its loop element, "while.1[3]"

    @property
    def key(self) -> str:
        return f"{self.loop}[{self.index}]"

    @property
    def ratio(self) -> float:
        return self.per_device_bytes / max(self.ideal_per_device_bytes, 1)


def buffer_findings(
    module: HloModule,
    result: PropagationResult,
    num_devices: int,
    threshold: float = 1.5,
    min_bytes: int = 1 << 20,
    manifest: Manifest | None = None,
    mesh: Mesh | None = None,
    gradients: list[StackedGradient] | None = None,
    accumulated: list[AccumulatedGradient] | None = None,
) -> list[Finding]:
    """Under-sharded carried buffers, gradients first, largest waste first."""
    if threshold < 1:
        raise ValueError(f"threshold={threshold} must be at least 1 (a multiple of the ideal)")
    if gradients is None:
        gradients = stacked_gradients(module, result, manifest, mesh)
    by_key = {(g.loop, g.index): g for g in gradients}
    findings: list[Finding] = []
    for a in accumulated or []:
        g = a.gradient
        match = g.name or (g.parameter.key if g.parameter else None)
        found = _against_parameter(ACCUMULATED_GRADIENT, a.loop, a.index, a.update, a.shape, a.sharding, a.ideal,
                                   match, threshold, min_bytes)  # fmt: skip
        if found is not None:
            findings.append(found)
    for loop, shardings in carried_loops(module, result):
        body = module.computation(loop.body)
        invariant = invariant_elements(body)
        for i, (leaf, s) in enumerate(zip(loop.instruction.shape.elements, shardings)):  # type: ignore[union-attr]
            if i in invariant or not is_stacked(leaf, loop.trip_count):
                continue
            assert isinstance(leaf, ArrayShape)
            current = per_device_bytes(leaf, s)
            gradient = by_key.get((loop.name, i))
            producer = body.root.operands[i] if body.root.opcode == "tuple" else body.root_name
            if gradient is not None and gradient.ideal is not None:
                kind, ideal_sharding = STACKED_GRADIENT, gradient.ideal.to_short_text()
                ideal = per_device_bytes(leaf, gradient.ideal)
                match = gradient.name or (gradient.parameter.key if gradient.parameter else None)
            else:
                kind, ideal_sharding, match = "large-buffer", None, None
                ideal = -(-leaf.byte_size // num_devices)
            waste = current - ideal
            if current > ideal * threshold and waste >= min_bytes:
                findings.append(
                    Finding(
                        kind=kind,
                        loop=loop.name,
                        index=i,
                        instruction=producer,
                        shape=leaf.to_text(with_layout=False),
                        current_sharding=s.to_short_text() if s is not None else "{replicated}",
                        ideal_sharding=ideal_sharding,
                        per_device_bytes=current,
                        ideal_per_device_bytes=ideal,
                        waste_bytes=waste,
                        matched_parameter=match,
                    )
                )
    findings.sort(key=lambda f: (f.kind not in GRADIENT_KINDS, -f.waste_bytes))
    return findings


def output_findings(
    module: HloModule, gradients: list[OutputGradient], threshold: float = 1.5, min_bytes: int = 1 << 20
) -> list[Finding]:
    """Returned gradients split over fewer devices than their parameter, largest waste first."""
    findings = []
    for g in gradients:
        found = _against_parameter(GRADIENT_OUTPUT, module.entry_name, g.position, g.value, g.shape, g.sharding,
                                   g.ideal, g.parameter, threshold, min_bytes)  # fmt: skip
        if found is not None:
            findings.append(found)
    return sorted(findings, key=lambda f: -f.waste_bytes)


def _against_parameter(
    kind: str,
    loop: str,
    index: int,
    instruction: str,
    shape: ArrayShape,
    sharding: HloSharding | None,
    ideal_sharding: HloSharding | None,
    parameter: str | None,
    threshold: float,
    min_bytes: int,
) -> Finding | None:
    """A gradient measured against its parameter's sharding, when it wastes enough to report."""
    if ideal_sharding is None:
        return None
    current, ideal = per_device_bytes(shape, sharding), per_device_bytes(shape, ideal_sharding)
    if current <= ideal * threshold or current - ideal < min_bytes:
        return None
    return Finding(
        kind=kind,
        loop=loop,
        index=index,
        instruction=instruction,
        shape=shape.to_text(with_layout=False),
        current_sharding=sharding.to_short_text() if sharding is not None else "{replicated}",
        ideal_sharding=ideal_sharding.to_short_text(),
        per_device_bytes=current,
        ideal_per_device_bytes=ideal,
        waste_bytes=current - ideal,
        matched_parameter=parameter,
    )

"""Placements: sharding annotations that fix a finding, and applying them to the IR.

For a stacked gradient the fix is to pin each iteration's gradient, the value
the backward loop writes into its `[L, ...]` accumulator, to the sharding of
the parameter it belongs to. That is what `mark_sharding_with_gradients` on
the weight slice inside the scanned body does in torch_xla; in HLO it is a
`Sharding` custom-call on the update of the accumulator's dynamic-update-slice.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner.hlo.ir import Attribute, Computation, HloModule, Instruction
from planner.hlo.shapes import ArrayShape
from planner.plan.findings import Finding
from planner.sharding import algebra
from planner.sharding.hlo_sharding import HloSharding
from planner.sharding.text import parse_sharding


@dataclass(frozen=True)
class ShardingPlacement:
    """Pin `instruction` (in `computation`) to `sharding` with a Sharding custom-call."""

    computation: str
    instruction: str
    sharding: str
    reason: str
    finding: str  # "loop[index]" of the finding it fixes


def placements_for(module: HloModule, findings: list[Finding]) -> list[ShardingPlacement]:
    placements = []
    for finding in findings:
        if finding.kind != "stacked-gradient" or finding.ideal_sharding is None:
            continue
        loop = module.instruction(finding.loop)
        body = module.computation(loop.attr("body").names[0])
        target, sharding = _update_of(body, finding.instruction, parse_sharding(finding.ideal_sharding))
        placements.append(
            ShardingPlacement(
                computation=body.name,
                instruction=target,
                sharding=sharding.to_text(),
                reason=f"pin the per-layer gradient written into {finding.loop}[{finding.index}] to its "
                f"parameter's sharding ({finding.matched_parameter})",
                finding=f"{finding.loop}[{finding.index}]",
            )
        )
    return placements


def _update_of(body: Computation, producer: str, ideal: HloSharding) -> tuple[str, HloSharding]:
    """The value to pin: the update of the accumulator's dynamic-update-slice, else the producer."""
    inst = body[producer]
    if inst.opcode == "dynamic-update-slice":
        update = body[inst.operands[1]]
        rank = ideal.tiled_data_rank if ideal.is_tiled else 0
        if isinstance(update.shape, ArrayShape) and update.shape.rank == rank:
            # The update covers one layer: the layer dim is not split.
            return update.name, algebra.partially_replicate_on_dims(ideal, [0])
    return producer, ideal


def apply_placements(module: HloModule, placements: list[ShardingPlacement]) -> HloModule:
    """A new module with a Sharding custom-call after every pinned instruction."""
    by_comp: dict[str, list[ShardingPlacement]] = {}
    for p in placements:
        by_comp.setdefault(p.computation, []).append(p)
    comps = []
    taken = {inst.name for comp in module.computations for inst in comp}
    for comp in module.computations:
        pins = {p.instruction: p for p in by_comp.get(comp.name, [])}
        if not pins:
            comps.append(comp)
            continue
        renamed: dict[str, str] = {}
        out: list[Instruction] = []
        for inst in comp.instructions:
            operands = tuple(renamed.get(o, o) for o in inst.operands)
            out.append(dataclasses.replace(inst, operands=operands) if operands != inst.operands else inst)
            pin = pins.get(inst.name)
            if pin is None:
                continue
            name = _fresh(f"{inst.name}.pinned", taken)
            sharding = parse_sharding(pin.sharding)
            attributes = (
                Attribute("custom_call_target", "Sharding", '"Sharding"'),
                Attribute("sharding", sharding, sharding.to_text()),
            )
            out.append(Instruction(name, "custom-call", inst.shape, (inst.name,), attributes))
            renamed[inst.name] = name
        root = renamed.get(comp.root_name, comp.root_name)
        comps.append(dataclasses.replace(comp, instructions=tuple(out), root_name=root))
    return dataclasses.replace(module, computations=tuple(comps))


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}.{k}"
    taken.add(name)
    return name

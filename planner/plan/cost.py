"""The compute a step costs per device: dot FLOPs, each dot counted as often as it runs.

A configuration search ranks candidates that fit by what they cost; the dots are nearly all of a
transformer step's FLOPs, and remat shows up as the dots the backward pass runs again. Worked
example: `dot(f32[8,512] lhs, f32[512,2048] rhs)` contracting dim 1 of lhs, lhs sharded
`{devices=[2,4]<=[8]}` (rows 2 ways, the contracted dim 4 ways) and the result `{devices=[2,1,4]<=[8]
last_tile_dim_replicate}`: each device computes a [4, 2048] partial product over 128 contracted
elements, 2 x 4 x 2048 x 128 = 2,097,152 FLOPs; inside a While body that runs 8 times, 16,777,216.
The contracted split counts only up to the devices the output's tiles leave (2 output tiles on 8
devices leave 4): no device does less than its share of the dot. A loop whose trip count is unknown
is counted once.
"""

from __future__ import annotations

import math

from planner.hlo.ir.module import HloModule
from planner.hlo.ir.shapes import ArrayShape
from planner.hlo.structure.loops import while_loops
from planner.propagation import PropagationResult
from planner.sharding.hlo_sharding import HloSharding


def dot_flops_per_device(module: HloModule, result: PropagationResult) -> int:
    """2 x output elements x contracted elements per device, summed over every dot of the step.

    `module` is the one `result` propagated (a prepared module's `module`, after its target's passes): a
    pass may have rebuilt a dot under another name (XLA:TPU's transpose-of-dot fold), which `result` knows
    by that name only."""
    runs = computation_runs(module)
    num_devices = int(module.attr("num_partitions") or 1)
    total = 0
    for comp in module.computations:
        times = runs.get(comp.name, 0)
        if times == 0:
            continue
        for inst in comp.instructions:
            if inst.opcode != "dot" or not isinstance(inst.shape, ArrayShape):
                continue
            lhs = comp[inst.operands[0]]
            if not isinstance(lhs.shape, ArrayShape):
                continue
            dims = tuple(inst.attr("lhs_contracting_dims", ()))
            lhs_shard = _shard(lhs.shape.dims, _sharding(result, lhs.name))
            out = _shard(inst.shape.dims, _sharding(result, inst.name))
            contracted = math.prod(lhs.shape.dims[d] for d in dims)
            # The contracted dim's split counts only as far as devices are left over by the output's tiles:
            # an axis that splits both is resharded before the dot, never dividing the work twice.
            out_tiles = math.prod(inst.shape.dims) // max(1, math.prod(out))
            splits = min(contracted // max(1, math.prod(lhs_shard[d] for d in dims)), max(1, num_devices // out_tiles))
            total += 2 * math.prod(out) * (contracted // max(1, splits)) * times
    return total


def computation_runs(module: HloModule) -> dict[str, int]:
    """How many times each computation runs per step: the entry once, a While body its trip count times
    its caller's runs (an unknown trip count as one), any other callee as often as its caller."""
    loops = {loop.name: loop for loop in while_loops(module)}
    runs = {module.entry_name: 1}
    pending = [module.entry_name]
    while pending:
        name = pending.pop()
        for inst in module.computation(name).instructions:
            for callee in inst.called_computations:
                times = runs[name]
                loop = loops.get(inst.name) if inst.opcode == "while" else None
                if loop is not None and callee == loop.body:
                    times *= loop.trip_count or 1
                if runs.get(callee, 0) < times:
                    runs[callee] = times
                    pending.append(callee)
    return runs


def _sharding(result: PropagationResult, name: str) -> HloSharding | None:
    return result.sharding(name) if name in result else None


def _shard(dims: tuple[int, ...], sharding: HloSharding | None) -> tuple[int, ...]:
    return sharding.shard_shape(dims) if sharding is not None else dims

"""Next steps when sharding is not enough: what holds the peak, and three changes, each predicted.

When the plan's result still exceeds the chip, the plan names what holds its peak (`peak_holders`)
and predicts each change on top of the plan with the same propagation and memory model:

- **More chips on the FSDP axis**: transform and re-simulate. Every sharding in the module is a
  layout of the mesh's axes (`remesh`); written again over the mesh with fsdp doubled it is the
  module the framework lowers on the larger mesh with the same global shapes, and propagation and
  the memory model run on it unchanged. The smallest doubling that fits is reported, or else the
  first. Which meshes to simulate is chosen by fitting per-chip bytes = fixed + sharded / factor
  through the plan and the first doubling; when the fixed part alone exceeds the chip no doubling
  is tried further (it is in the summary; every reported number is a simulation). With one sample
  per chip already, more chips shrink weights, gradients and optimizer state, not activations: XLA
  pads the batch, as the model's ceil(dim / tiles) does.
- **A smaller microbatch**: transform and re-simulate, without rewriting a shape. Per device,
  dividing the batch by k is the batch dim split k times more: the module gets a mesh axis
  `microbatch` of size k that splits only the step's batch inputs (dim 0) and replicates everything
  else, and propagation carries the split to exactly the values derived from the batch, the buffers
  a smaller batch shrinks. The largest fraction 1/2, 1/4, ... that fits is reported, searching while
  the batch per chip still shrinks. Batch inputs are the entry parameters of rank >= 2 split on
  dim 0 over the fsdp (or data) axis that no output mirrors in shape (a weight has a gradient of its
  shape, an input has none); a frozen weight split that way would be taken for one.
- **Remat of the scanned layer**: per-buffer accounting on the plan's own buffers. The transform
  would rewrite loop bodies (the forward layer cloned into the backward body, the residuals taken
  out of both loops' tuples), which is no change of shardings and differs per front end; the memory
  model's buffers say what it changes. From the plan's peak: drop the saved activations (each
  `[L, ...]` buffer the forward loop writes and the backward loop reads); add the layer inputs the
  forward saves instead (L x each activation the forward loop carries, at the sharding it enters the
  loop with, see `_carried_activation_bytes`); add the recomputation inside the backward body: one
  layer's slice of every dropped residual, live there at once, less the slices the body already
  copies out of the saved stacks, plus what the forward body's own peak exceeds the backward
  body's. Against XLA:TPU (v6e) compiling the 405B-shaped step with `jax.checkpoint` and pinned
  gradients: -11.8% at sequence 1024, +0.9% at 2048 (tests/test_next_steps.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from planner.hlo.ir.module import HloModule
from planner.hlo.ir.shapes import ArrayShape
from planner.hlo.structure.loops import WhileLoop, invariant_elements
from planner.memory import memory_report
from planner.memory.buffers import array_leaves, leaf_shardings, per_device_bytes
from planner.memory.conversions import widened_bytes
from planner.memory.estimation import estimate_memory
from planner.memory.model import MemoryEstimate
from planner.mesh import Mesh
from planner.plan.diagnosis.peak_holders import (
    SavedActivation,
    loops_by_name,
    loops_of,
    peak_holders,
    saved_activations,
    stacked_gradient_names,
)
from planner.plan.diagnosis.scan_pairs import StackedGradient
from planner.plan.fixes.remesh import axis_layout, remesh_module
from planner.plan.model import NextStepInfo, PeakHolderInfo
from planner.prepare import PreparedModule, reprepare
from planner.propagation import PropagationResult
from planner.units import format_bytes

FSDP_AXES = ("fsdp", "data")  # the axis more chips go on: fsdp, or data parallel when there is no fsdp
MICROBATCH_AXIS = "microbatch"
MAX_DOUBLINGS = 6  # 64 times the chips
MAX_BATCH_DIVISOR = 64


@dataclass(frozen=True)
class Step:
    """The plan's result: its prepared module with the placements, propagated, and the chip it must fit."""

    prepared: PreparedModule
    result: PropagationResult
    capacity_bytes: int

    @property
    def module(self) -> HloModule:
        return self.prepared.module

    @property
    def mesh(self) -> Mesh | None:
        return self.prepared.mesh

    def estimate(self) -> MemoryEstimate:
        return estimate_memory(self.prepared, self.result)

    def simulate(self, front: HloModule, mesh: Mesh) -> int:
        """HBM per chip of a changed step (`front`, the module before the target's passes, on `mesh`)."""
        changed = reprepare(self.prepared, front, mesh)
        return memory_report(changed, self.capacity_bytes).peak_chip_bytes


def beyond_sharding(
    step: Step, gradients: list[StackedGradient] | None = None
) -> tuple[list[PeakHolderInfo], list[NextStepInfo], list[str]]:
    """What holds the peak after the plan, the changes beyond sharding, each predicted, and the
    changes that cannot be predicted for this step, with why."""
    estimate = step.estimate()
    holders = peak_holders(step.module, estimate, stacked_gradient_names(step.module, gradients or []))
    options: list[tuple[str, Callable[[], NextStepInfo]]] = [
        ("remat", lambda: remat(step, estimate)),
        ("more-fsdp-chips", lambda: more_fsdp_chips(step, estimate.total_bytes)),
        ("smaller-microbatch", lambda: smaller_microbatch(step)),
    ]
    predicted, unavailable = [], []
    for kind, option in options:
        try:
            predicted.append(option())
        except ValueError as e:
            unavailable.append(f"{kind}: {e}")
    return holders, predicted, unavailable


def _fits(total: int, capacity: int) -> bool:
    return total <= capacity


# -- remat ------------------------------------------------------------------------------------------


def remat(step: Step, estimate: MemoryEstimate) -> NextStepInfo:
    """`jax.checkpoint` (torch_xla: scan's remat) around the scanned layer, accounted on the plan's buffers."""
    saved = saved_activations(step.module, estimate)
    if not saved:
        raise ValueError("no saved activations at the peak: no [L, ...] buffer one loop writes and another reads")
    forward = saved[0].forward
    backward = _reader(step.module, saved[0])
    trips = forward.trip_count or 1
    dropped = sum(s.buffer.size_bytes for s in saved)
    inputs = trips * _carried_activation_bytes(step, forward)
    if dropped <= inputs:
        raise ValueError(
            f"the forward saves no more than its layers' inputs ({format_bytes(dropped)}): remat'ed already"
        )
    residuals = _new_layer_residual_bytes(step, estimate, saved, backward, trips)
    body_peaks = estimate.body_peak_bytes
    transient = 0
    if backward is not None:
        transient = max(0, body_peaks.get(forward.body, 0) - body_peaks.get(backward.body, 0))
    total = estimate.total_bytes - dropped + inputs + residuals + transient
    return NextStepInfo(
        kind="remat",
        summary=(
            "remat the scanned layer (jax.checkpoint around it; torch_xla: scan_layers with a remat partition_fn): "
            f"the forward saves each layer's input ({format_bytes(inputs)} per chip) instead of "
            f"{format_bytes(dropped)} of residuals, and the backward recomputes one layer's forward "
            f"(+{format_bytes(residuals + transient)})"
        ),
        predicted_total=total,
        fits=_fits(total, step.capacity_bytes),
        settings={
            "saved_activations_dropped_bytes": dropped,
            "saved_layer_inputs_bytes": inputs,
            "recomputed_layer_bytes": residuals + transient,
        },
    )


def _reader(module: HloModule, s: SavedActivation) -> WhileLoop | None:
    """The loop that reads the saved activation (it carries it without writing it)."""
    for loop in loops_of(loops_by_name(module), s.buffer):
        if loop.name == s.forward.name:
            continue
        index = next(v[2] for v in s.buffer.values if v[1] == loop.name)
        if index in invariant_elements(module.computation(loop.body)):
            return loop
    return None


def _carried_activation_bytes(step: Step, loop: WhileLoop) -> int:
    """Per-device bytes of what the forward loop carries from layer to layer (its activations).

    Each at the sharding it enters the loop with, not the one propagation gives the carry without
    remat: on the 405B-shaped step XLA partitions the carry bf16[1,1024,4096] without remat (the
    sharding of the layer's last dot) and bf16[1,1024,16384], the input's own, with jax.checkpoint;
    the simulator's propagation does the same on both modules.
    """
    comp = step.module.computation(loop.computation)
    init = comp[loop.instruction.operands[0]]
    body = step.module.computation(loop.body)
    invariant = invariant_elements(body)
    root = body.root
    leaves = array_leaves(loop.instruction.shape)
    shardings = leaf_shardings(loop.instruction.shape, step.result.sharding(loop.name))
    total = 0
    for i, (leaf, sharding) in enumerate(zip(leaves, shardings)):
        # Carried from layer to layer: rewritten whole each iteration, not one layer's slice of a stack.
        writer = body[root.operands[i]].opcode if root.opcode == "tuple" and i < len(root.operands) else None
        if i in invariant or leaf.rank == 0 or writer in (None, "dynamic-update-slice"):
            continue
        if init.opcode == "tuple" and i < len(init.operands) and init.operands[i] in step.result:
            sharding = step.result.sharding(init.operands[i])
        total += per_device_bytes(leaf, sharding)
    return total


def _new_layer_residual_bytes(
    step: Step, estimate: MemoryEstimate, saved: list[SavedActivation], backward: WhileLoop | None, trips: int
) -> int:
    """One layer's slice of every saved residual, less what the backward body already materialises as slices."""
    backend = step.prepared.target
    sliced = _materialised_slices(step.module, estimate, backward, saved) if backward is not None else {}
    total = 0
    for s in saved:
        layer = ArrayShape(s.buffer.shape.element_type, s.buffer.shape.dims[1:])
        per_layer = widened_bytes(-(-s.buffer.size_bytes // trips), layer, backend)
        total += max(0, per_layer - sliced.get(s.buffer.id, 0))
    return total


def _materialised_slices(
    module: HloModule, estimate: MemoryEstimate, backward: WhileLoop, saved: list[SavedActivation]
) -> dict[int, int]:
    """Bytes of the backward body's own buffers that are dynamic-slices of each saved stack."""
    body = module.computation(backward.body)
    param = body.parameters[0].name if body.parameters else None
    element = {next(v[2] for v in s.buffer.values if v[1] == backward.name): s.buffer.id for s in saved}
    slices: dict[str, int] = {}
    for inst in body.instructions:
        if inst.opcode != "dynamic-slice":
            continue
        source = body[inst.operands[0]]
        if source.opcode == "get-tuple-element" and source.operands[0] == param and source.attr("index") in element:
            slices[inst.name] = element[source.attr("index")]
    found: dict[int, int] = {}
    for b in estimate.buffers:
        if b.computation == body.name and b.start < 0:
            for v in b.values:
                if v[0] == body.name and v[1] in slices:
                    found[slices[v[1]]] = found.get(slices[v[1]], 0) + b.size_bytes
                    break
    return found


# -- more chips on the FSDP axis -----------------------------------------------------------------


def fsdp_axis(mesh: Mesh | None) -> str | None:
    if mesh is None:
        return None
    return next((a for a in FSDP_AXES if a in mesh.axis_names and mesh.shape[mesh.axis_names.index(a)] > 1), None)


def grown_mesh(mesh: Mesh, axis: str, factor: int) -> Mesh:
    shape = tuple(n * factor if a == axis else n for a, n in zip(mesh.axis_names, mesh.shape))
    return Mesh(shape, mesh.axis_names)


def predict_more_fsdp_chips(step: Step, factor: int) -> int:
    """HBM per chip with the fsdp axis `factor` times as large (the module re-meshed and re-simulated)."""
    mesh, axis = step.mesh, fsdp_axis(step.mesh)
    if mesh is None or axis is None:
        raise ValueError("more chips on the FSDP axis needs a mesh with an fsdp (or data) axis")
    bigger = grown_mesh(mesh, axis, factor)
    return step.simulate(remesh_module(step.prepared.front, mesh, bigger), bigger)


def more_fsdp_chips(step: Step, now: int) -> NextStepInfo:
    """The smallest mesh with fsdp doubled (again) that fits, or the first doubling when none does."""
    mesh, axis = step.mesh, fsdp_axis(step.mesh)
    if mesh is None or axis is None:
        raise ValueError(f"the mesh ({mesh.to_text() if mesh else 'none given'}) has no fsdp or data axis to grow")
    size, capacity = mesh.shape[mesh.axis_names.index(axis)], step.capacity_bytes
    tried: dict[int, int] = {}

    def fits_at(factor: int) -> bool:
        if factor not in tried:
            tried[factor] = predict_more_fsdp_chips(step, factor)
        return _fits(tried[factor], capacity)

    # fixed + sharded / factor through the plan (factor 1) and the first doubling: where to look.
    fits_at(2)
    sharded = 2 * (now - tried[2])
    fixed = now - sharded
    best, largest = None, 2**MAX_DOUBLINGS
    if fixed <= capacity and sharded > 0:
        factor = 2
        while factor < largest and fixed + sharded / factor > capacity:
            factor *= 2
        while factor <= largest and not fits_at(factor):
            factor *= 2
        if factor <= largest:
            while factor > 2 and fits_at(factor // 2):
                factor //= 2
            best = factor
    chosen = best or 2
    total = tried[chosen]
    bigger = grown_mesh(mesh, axis, chosen)
    where = f"mesh {bigger.to_text()} ({bigger.num_devices} chips): {format_bytes(total)} per chip"
    if best is not None:
        summary = f"{where}, the smallest doubling of {axis}={size} that fits"
    elif fixed > capacity:
        summary = (
            f"{where}; no larger {axis} fits: {format_bytes(fixed)} per chip does not shrink with {axis} "
            "(what every chip holds whole, such as activations once the batch is one sample per chip)"
        )
    else:
        far = max(tried)
        summary = f"{where}; still {format_bytes(tried[far])} at {axis}={size * far} ({mesh.num_devices * far} chips)"
    return NextStepInfo(
        kind="more-fsdp-chips",
        summary=summary,
        predicted_total=total,
        fits=best is not None,
        settings={axis: size * chosen, "num_devices": bigger.num_devices, "fixed_bytes_estimate": fixed},
    )


# -- a smaller microbatch ----------------------------------------------------------------------------


def batch_inputs(module: HloModule, mesh: Mesh) -> dict[str, tuple[int, int]]:
    """Entry parameters that carry the batch: name -> (global batch, tiles on it now). See the module doc."""
    entry = module.entry
    outputs = {leaf.dims for leaf in array_leaves(entry.root.shape)}
    found = {}
    for p in entry.parameters:
        shape, sharding = p.shape, p.sharding
        if not isinstance(shape, ArrayShape) or shape.rank < 2 or shape.dims in outputs or sharding is None:
            continue
        if not sharding.is_tiled:
            continue
        layout = axis_layout(sharding, mesh)
        if layout is None or not set(layout[0]) & set(FSDP_AXES):
            continue
        found[p.name] = (shape.dims[0], sharding.data_tile_dims[0])
    return found


def microbatch_mesh(mesh: Mesh, divisor: int) -> Mesh:
    return Mesh((*mesh.shape, divisor), (*mesh.axis_names, MICROBATCH_AXIS))


def predict_smaller_microbatch(step: Step, divisor: int) -> int:
    """HBM per chip with the batch divided by `divisor`: its dim split over a new `microbatch` axis."""
    mesh = step.mesh
    if mesh is None:
        raise ValueError("a smaller microbatch needs the mesh the batch is split over")
    inputs = batch_inputs(step.prepared.front, mesh)
    if not inputs:
        raise ValueError("no batch input: no entry parameter is split on dim 0 over fsdp or data")
    split_mesh = microbatch_mesh(mesh, divisor)
    module = remesh_module(step.prepared.front, mesh, split_mesh, {name: (0, MICROBATCH_AXIS) for name in inputs})
    return step.simulate(module, split_mesh)


def smaller_microbatch(step: Step) -> NextStepInfo:
    """The largest fraction of the batch (1/2, 1/4, ...) that fits, or the smallest that still shrinks it."""
    mesh = step.mesh
    if mesh is None:
        raise ValueError("no mesh given: the batch's split is unknown")
    inputs = batch_inputs(step.prepared.front, mesh)
    if not inputs:
        raise ValueError("no batch input: no entry parameter without a same-shaped output is split on dim 0 "
                         "over fsdp or data")  # fmt: skip
    batch, tiles = max(inputs.values())
    per_chip = math.ceil(batch / tiles)
    tried: dict[int, int] = {}
    divisor = 2
    while True:
        tried[divisor] = predict_smaller_microbatch(step, divisor)
        shrinks = math.ceil(batch / (tiles * divisor * 2)) < math.ceil(batch / (tiles * divisor))
        if _fits(tried[divisor], step.capacity_bytes) or not shrinks or divisor * 2 > MAX_BATCH_DIVISOR:
            break
        divisor *= 2
    fits = _fits(tried[divisor], step.capacity_bytes)
    chosen = divisor if fits else max(tried)
    total = tried[chosen]
    micro = batch // chosen if batch % chosen == 0 else batch / chosen
    left = math.ceil(batch / (tiles * chosen))
    summary = (
        f"microbatch 1/{chosen} of the batch ({micro} of {batch}, {left} per chip): {format_bytes(total)} per chip"
    )
    if not fits and left == per_chip:
        summary += f"; the batch is already {per_chip} per chip over {tiles} chips: XLA pads, nothing shrinks"
    elif not fits:
        summary += f"; at {left} per chip no smaller fraction shrinks the batch per chip"
    elif chosen > 2:
        summary += f", the largest fraction that fits (1/{chosen // 2}: {format_bytes(tried[chosen // 2])})"
    return NextStepInfo(
        kind="smaller-microbatch",
        summary=summary,
        predicted_total=total,
        fits=fits,
        settings={"microbatch_fraction": 1 / chosen, "batch": batch, "batch_per_chip": left},
    )

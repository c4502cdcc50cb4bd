"""What holds the memory at the peak, by kind: the memory model's own buffers, named.

The memory model's buffers at the peak (`estimate_memory`'s peak buffers, with the entry's
parameters and outputs) are sorted into kinds; the kinds add up to the report's HBM per chip:
- saved activations: `[L, ...]` buffers one loop writes and a later loop reads — the forward
  scan's residuals, saved for the backward scan (its loop-carried buffers span both Whiles);
- stacked gradients: `[L, ...]` buffers a single loop accumulates, carried or returned as outputs;
- parameters and optimizer state: the entry parameters (optimizer state by its name: `opt_state`,
  `mu`, `nu`, `momentum`, ... in the parameter's op_name);
- outputs: the rest of what the step returns, less donated (aliased) parameters;
- temporaries: everything else live at the peak, less what the chip's on-chip memory holds;
- other: loop-carried buffers that are neither (the scan's carry, hoisted masks and tables).
Each item names the buffer as the memory report does (`while.513[10]`, a loop element) with its
per-device shape, and, when the dump's metadata has them, the user's name (JAX's op_name on the
entry parameter it comes from, e.g. `params['wq']`) and the source line that produces it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from planner.hlo.debug_info import source_location
from planner.hlo.ir import Computation, HloModule, Instruction
from planner.hlo.loops import WhileLoop, invariant_elements, while_loops
from planner.memory.buffers import Buffer
from planner.memory.model import MemoryEstimate
from planner.plan.model import PeakHolderInfo
from planner.units import format_bytes

KINDS = ("saved-activations", "stacked-gradients", "parameters", "optimizer-state", "outputs", "temporaries", "other")
_OPTIMIZER = re.compile(r"opt_state|optimizer|\bmu\b|\bnu\b|momentum|moment|adam|exp_avg", re.I)
# Ops through which a value is still the value it was made from (for finding its producer).
_PASS = frozenset("reshape bitcast broadcast copy convert transpose".split())


@dataclass(frozen=True)
class SavedActivation:
    """A residual the forward loop writes per layer and the backward loop reads."""

    buffer: Buffer
    forward: WhileLoop
    index: int  # element of the forward loop's carried tuple
    source: str | None  # where one layer's value is made: file:line (op_name)


def loops_by_name(module: HloModule) -> dict[str, WhileLoop]:
    return {loop.name: loop for loop in while_loops(module)}


def loops_of(loops: dict[str, WhileLoop], buffer: Buffer) -> list[WhileLoop]:
    """The Whiles (of `loops_by_name`) whose carried tuples hold `buffer`, in program order."""
    return [loops[n] for n in dict.fromkeys(v[1] for v in buffer.values if v[1] in loops)]


def _element(buffer: Buffer, loop: WhileLoop) -> int | None:
    return next((v[2] for v in buffer.values if v[1] == loop.name), None)


def _stacked_over(buffer: Buffer, loop: WhileLoop) -> bool:
    return loop.trip_count is not None and buffer.shape.rank >= 2 and buffer.shape.dims[0] == loop.trip_count


def saved_activations(module: HloModule, estimate: MemoryEstimate) -> list[SavedActivation]:
    """The peak's `[L, ...]` buffers written by one loop's body and only read by a later loop's."""
    found = []
    by_name = loops_by_name(module)
    for b in estimate.peak_buffers:
        if b.category != "loop-carried":
            continue
        loops = loops_of(by_name, b)
        writers = [loop for loop in loops if _element(b, loop) not in invariant_elements(module.computation(loop.body))]
        if len(loops) < 2 or len(writers) != 1 or not _stacked_over(b, writers[0]):
            continue
        index = _element(b, writers[0])
        assert index is not None
        found.append(SavedActivation(b, writers[0], index, _written_value_source(module, writers[0], index)))
    return found


def _written_value_source(module: HloModule, loop: WhileLoop, index: int) -> str | None:
    """Where the body makes the value it writes into element `index` (the update of its dynamic-update-slice)."""
    body = module.computation(loop.body)
    if body.root.opcode != "tuple":
        return None
    inst = body[body.root.operands[index]]
    if inst.opcode == "dynamic-update-slice":
        inst = body[inst.operands[1]]
    inst = _producer(body, inst)
    return source_location(module, inst)


def _producer(comp: Computation, inst: Instruction) -> Instruction:
    """The op that computes `inst`'s value, past the reshapes and broadcasts that stack it."""
    for _ in range(16):
        if inst.opcode == "get-tuple-element" and comp[inst.operands[0]].opcode == "tuple":
            inst = comp[comp[inst.operands[0]].operands[inst.attr("index")]]  # an inlined call's result
        elif inst.opcode in _PASS and inst.operands:
            inst = comp[inst.operands[0]]
        else:
            return inst
    return inst


def entry_parameter_name(inst: Instruction) -> str | None:
    """The user's name of an entry parameter: its op_name (JAX writes `params['wq']`)."""
    metadata = inst.metadata
    if metadata is None or not metadata.op_name:
        return None
    return metadata.op_name.replace("\\'", "'")  # the dump escapes quotes inside the string


def _loop_init_parameter(module: HloModule, loop: WhileLoop, index: int) -> Instruction | None:
    """The entry parameter element `index` of a While starts from, through views."""
    comp = module.computation(loop.computation)
    init = comp[loop.instruction.operands[0]]
    if init.opcode != "tuple" or index >= len(init.operands):
        return None
    inst = comp[init.operands[index]]
    for _ in range(16):
        if inst.opcode == "parameter":
            return inst if comp.name == module.entry_name else None
        if inst.opcode not in _PASS | {"get-tuple-element"} or not inst.operands:
            return None
        inst = comp[inst.operands[0]]
    return None


def _per_device_shape(b: Buffer) -> str:
    dims = b.sharding.shard_shape(b.shape.dims) if b.sharding is not None and b.sharding.is_tiled else b.shape.dims
    return f"{b.shape.element_type}[{','.join(map(str, dims))}]"


def peak_holders(
    module: HloModule,
    estimate: MemoryEstimate,
    names: dict[str, str] | None = None,
    top: int = 3,
) -> list[PeakHolderInfo]:
    """The peak's bytes per device by kind, largest first; they add up to the estimate's total.

    `names` names stacked-gradient loop elements (`while.1044[4]`) by their parameter (`gradient_names`).
    """
    names = names or {}
    entry = module.entry
    by_name = loops_by_name(module)
    saved = saved_activations(module, estimate)
    saved_ids = {s.buffer.id for s in saved}
    items: dict[str, list[tuple[int, str]]] = {k: [] for k in KINDS}
    totals = dict.fromkeys(KINDS, 0)

    def add(kind: str, size: int, text: str) -> None:
        totals[kind] += size
        items[kind].append((size, text))

    for s in saved:
        where = f", made at {s.source}" if s.source else ""
        add("saved-activations", s.buffer.size_bytes,
            f"{s.buffer.defined_by} {s.buffer.shape.to_text(with_layout=False)} -> {_per_device_shape(s.buffer)} "
            f"per device ({format_bytes(s.buffer.size_bytes)}){where}")  # fmt: skip
    carried = 0
    for b in estimate.peak_buffers:
        if b.category != "loop-carried":
            items["temporaries"].append((b.size_bytes, _describe(b, names)))
            continue
        carried += b.size_bytes
        if b.id in saved_ids:
            continue
        loops = loops_of(by_name, b)
        stacked = len(loops) == 1 and _stacked_over(b, loops[0])
        add("stacked-gradients" if stacked else "other", b.size_bytes, _describe(b, names))
    # The rest of the peak: entry temporaries live there and, at a While, its body's own peak. The
    # backend's on-chip memory holds up to `on_chip_bytes` of the peak, temporaries first (XLA:TPU's
    # memory-space assignment places them); the model does not say which loop-carried buffer holds
    # any rest, so it comes off the loop-carried kinds, largest first.
    gross = estimate.temp_bytes + estimate.on_chip_bytes - carried
    totals["temporaries"] = max(0, gross - estimate.on_chip_bytes)
    rest = estimate.on_chip_bytes - (gross - totals["temporaries"])
    for kind in sorted(("saved-activations", "stacked-gradients", "other"), key=lambda k: -totals[k]):
        taken = min(rest, totals[kind])
        totals[kind] -= taken
        rest -= taken
    scheduled = (estimate.scheduled or module).entry  # the order the estimate's positions refer to
    at_peak = scheduled.instructions[estimate.peak_position] if scheduled.instructions else None
    if at_peak is not None and at_peak.opcode == "while":
        body = at_peak.attr("body").names[0]
        for b in estimate.buffers:
            if b.start < 0 and b.computation == body:
                items["temporaries"].append((b.size_bytes, f"in the body of {at_peak.name}: " + _describe(b, {})))
    for b in estimate.buffers:
        if b.category != "parameter" or b.computation != entry.name:
            continue
        inst = next((entry[v[1]] for v in b.values if v[0] == entry.name and entry[v[1]].opcode == "parameter"), None)
        name = entry_parameter_name(inst) if inst is not None else None
        kind = "optimizer-state" if name and _OPTIMIZER.search(name) else "parameters"
        where = inst.name if inst is not None else b.defined_by
        label = f"{name} ({where})" if name else where
        add(kind, b.size_bytes, f"{label} {b.shape.to_text(with_layout=False)} -> {_per_device_shape(b)} per device "
                                f"({format_bytes(b.size_bytes)})")  # fmt: skip
    # Parameter buffers and the report's argument bytes agree; keep the report's number exact.
    argument = totals["parameters"] + totals["optimizer-state"]
    totals["parameters"] += estimate.argument_bytes - argument
    outputs = estimate.output_bytes - estimate.alias_bytes
    for b in estimate.buffers:
        if b.category != "output":
            continue
        loops = loops_of(by_name, b)
        if len(loops) == 1 and _stacked_over(b, loops[0]):
            add("stacked-gradients", b.size_bytes, _describe(b, names))
            outputs -= b.size_bytes
        else:
            items["outputs"].append((b.size_bytes, _describe(b, names)))
    totals["outputs"] += outputs
    holders = [
        PeakHolderInfo(
            kind=k, per_device_bytes=totals[k], items=[t for _, t in sorted(items[k], key=lambda x: -x[0])[:top]]
        )
        for k in KINDS
        if totals[k]
    ]
    assert sum(h.per_device_bytes for h in holders) == estimate.total_bytes, "peak holders must add up to the total"
    return sorted(holders, key=lambda h: -h.per_device_bytes)


def _describe(b: Buffer, gradient_names: dict[str, str]) -> str:
    name = gradient_names.get(b.defined_by)
    who = f" (gradient of {name})" if name else ""
    return (
        f"{b.defined_by}{who} {b.shape.to_text(with_layout=False)} -> {_per_device_shape(b)} per device "
        f"({format_bytes(b.size_bytes)}, {b.category})"
    )


def gradient_names(module: HloModule, gradients: list[tuple[str, WhileLoop, int]]) -> dict[str, str]:
    """`while.1044[4]` -> `params['w_down']`: each stacked gradient's key to its parameter's user name.

    `gradients` lists (gradient key, forward loop, the parameter's element of it).
    """
    names = {}
    for key, loop, index in gradients:
        param = _loop_init_parameter(module, loop, index)
        name = entry_parameter_name(param) if param is not None else None
        if name:
            names[key] = name
    return names

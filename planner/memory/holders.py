"""What holds the peak: every buffer live at it, by kind, named. They add up to the memory model's total.

XLA's compiled memory stats count, per device, every argument, every output (a donated argument once)
and the heap's peak of temporaries (`MemoryEstimate`). The holders are those buffers, one by one:
- parameters and optimizer state: each entry parameter (optimizer state by its op_name: `opt_state`,
  `mu`, `nu`, `momentum`, ...);
- outputs: each element of the root that holds bytes of its own, and the root tuple's table of pointers;
- the temporaries live at the peak (`MemoryEstimate.peak_temporaries`): the entry's, and at a While
  there, what its body holds at the body's own peak.
Loop-carried `[L, ...]` buffers among them are told apart by what the loops do with them:
- saved activations: written by one loop and read by a later one (the forward scan's residuals);
- stacked gradients: written by a single loop, carried to its end or returned;
- other: the rest of what loops carry (the scan's carry, a loop's copy of a stacked weight it only
  reads, hoisted masks and tables);
- temporaries: everything else.
What the backend's on-chip memory holds of the peak (`on_chip_bytes`) is not HBM, and the heap's packing
(`packing_bytes`) is no buffer's: the holders add up to the total plus the one, less the other.

Each holder's bytes are its per-device array's (`Buffer.held`): f32[8,1024,4096] under
{devices=[1,2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate} is f32[8,512,4096] on every device, 8 x 512 x
4096 x 4 bytes = 64 MiB. A buffer kept otherwise (XLA:CPU computes bf16 work in f32) holds the array
as stored, and says so in its note.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from planner.hlo.ir.debug_info import source_location
from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.hlo.structure.loops import WhileLoop, invariant_elements, while_loops
from planner.memory.buffers import Buffer
from planner.memory.model import MemoryEstimate
from planner.units import format_bytes

KINDS = ("saved-activations", "stacked-gradients", "parameters", "optimizer-state", "outputs", "temporaries", "other")
# The kinds a loop-carried buffer can be, and the kinds the peak's temporaries fall into.
CARRIED_KINDS = ("saved-activations", "stacked-gradients", "other")
_OPTIMIZER = re.compile(r"opt_state|optimizer|\bmu\b|\bnu\b|momentum|moment|adam|exp_avg", re.I)
# Ops through which a value is still the value it was made from (for finding its producer).
_PASS = frozenset("reshape bitcast broadcast copy convert transpose".split())


@dataclass(frozen=True)
class Holder:
    """One buffer holding bytes at the peak, per device."""

    kind: str  # one of KINDS
    buffer: Buffer
    # The buffer as the model names it (`while.953[30]`, a loop element), a parameter by its instruction.
    label: str
    # The user's name, or what the buffer is of a named tensor: `params['wq']`, `gradient of params['wq']`.
    name: str | None = None
    source: str | None = None  # where one layer's value is made: file:line (op_name)
    where: str | None = None  # the While whose body holds it at its own peak

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind

    @property
    def per_device_bytes(self) -> int:
        return self.buffer.size_bytes

    @property
    def shard_shape(self) -> tuple[int, ...]:
        return self.buffer.held.dims

    def describe(self, with_bytes: bool = True) -> str:
        """`while.2384[38] (gradient of params['w_down']) f32[8,1024,4096] -> f32[8,512,4096] per device
        (64.0 MiB, output)`; a parameter leads with its user's name."""
        b = self.buffer
        if self.name and self.kind in ("parameters", "optimizer-state"):
            who = f"{self.name} ({self.label})"
        else:
            who = f"{self.label} ({self.name})" if self.name else self.label
        if self.where:
            who += f" in the body of {self.where}"
        detail = ", ".join(
            part
            for part in (format_bytes(b.size_bytes) if with_bytes else None, b.category, b.note)
            if part is not None
        )
        shape, held = b.shape.to_text(with_layout=False), b.held.to_text(with_layout=False)
        arrays = f"{held} per device" if shape == held else f"{shape} -> {held} per device"
        made = f", made at {self.source}" if self.source else ""
        return f"{who} {arrays} ({detail}){made}"


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


def _writes(module: HloModule, loop: WhileLoop, buffer: Buffer) -> bool:
    """Whether `loop`'s body writes the element of its carried tuple that `buffer` is."""
    return _element(buffer, loop) not in invariant_elements(module.computation(loop.body))


def saved_activations(module: HloModule, estimate: MemoryEstimate) -> list[SavedActivation]:
    """The peak's `[L, ...]` buffers written by one loop's body and only read by a later loop's."""
    found = []
    by_name = loops_by_name(module)
    for b in estimate.peak_buffers:
        if b.category != "loop-carried":
            continue
        loops = loops_of(by_name, b)
        writers = [loop for loop in loops if _writes(module, loop, b)]
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


def loop_init_parameter(module: HloModule, loop: WhileLoop, index: int) -> Instruction | None:
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


def holders_at_peak(
    module: HloModule, estimate: MemoryEstimate, gradient_names: Mapping[str, str] | None = None
) -> list[Holder]:
    """Every buffer holding bytes at the peak, largest first: parameters, outputs, and the temporaries
    live there. Their bytes add up to `estimate.total_bytes + estimate.on_chip_bytes - estimate.packing_bytes`.

    `gradient_names` names stacked gradients by their buffer (`while.1044[4]` -> `params['w_down']`).
    """
    module = estimate.scheduled or module  # the module the estimate's buffers refer to
    gradient_names = gradient_names or {}
    entry = module.entry
    by_name = loops_by_name(module)
    body_owner = {comp: loop.name for loop in by_name.values() for comp in (loop.body, loop.condition)}
    saved = {s.buffer.id: s for s in saved_activations(module, estimate)}
    # Among equal bytes, what the peak's position holds comes first, then outputs, then parameters.
    holders = []
    for b in estimate.peak_temporaries:
        # A buffer local to a While body (no position in the entry) holds the body's peak.
        where = body_owner.get(b.computation) if b.start < 0 else None
        if where is None and b.id in saved:
            holders.append(Holder("saved-activations", b, b.defined_by, source=saved[b.id].source))
        elif b.category == "loop-carried":
            holders.append(_carried(module, by_name, b, gradient_names, where))
        else:
            holders.append(Holder("temporaries", b, b.defined_by, where=where))
    for b in estimate.outputs:
        loops = loops_of(by_name, b)
        gradient = len(loops) == 1 and _stacked_over(b, loops[0]) and _writes(module, loops[0], b)
        kind = "stacked-gradients" if gradient else "outputs"
        holders.append(Holder(kind, b, b.defined_by, _gradient(gradient_names, b)))
    for b in estimate.buffers:
        if b.category != "parameter":
            continue
        inst = next((entry[v[1]] for v in b.values if v[0] == entry.name and entry[v[1]].opcode == "parameter"), None)
        name = entry_parameter_name(inst) if inst is not None else None
        kind = "optimizer-state" if name and _OPTIMIZER.search(name) else "parameters"
        holders.append(Holder(kind, b, inst.name if inst is not None else b.defined_by, name))
    return sorted(holders, key=lambda h: -h.per_device_bytes)


def _gradient(gradient_names: Mapping[str, str], b: Buffer) -> str | None:
    name = gradient_names.get(b.defined_by)
    return f"gradient of {name}" if name else None


def _carried(
    module: HloModule,
    by_name: dict[str, WhileLoop],
    b: Buffer,
    gradient_names: Mapping[str, str],
    where: str | None,
) -> Holder:
    """A loop-carried buffer other than a saved activation: a stacked gradient the one loop holding it
    writes, else `other` (named after the parameter a loop's copy of a stacked weight starts from)."""
    loops = loops_of(by_name, b)
    if len(loops) == 1 and _stacked_over(b, loops[0]):
        if _writes(module, loops[0], b):
            return Holder("stacked-gradients", b, b.defined_by, _gradient(gradient_names, b), where=where)
        index = _element(b, loops[0])
        param = loop_init_parameter(module, loops[0], index) if index is not None else None
        name = entry_parameter_name(param) if param is not None else None
        what = f"copy of {name or param.name}" if param is not None else "a stacked input"
        return Holder("other", b, b.defined_by, f"{what} the loop only reads", where=where)
    return Holder("other", b, b.defined_by, where=where)


def gradient_names(module: HloModule, gradients: list[tuple[str, WhileLoop, int]]) -> dict[str, str]:
    """`while.1044[4]` -> `params['w_down']`: each stacked gradient's key to its parameter's user name.

    `gradients` lists (gradient key, forward loop, the parameter's element of it).
    """
    names = {}
    for key, loop, index in gradients:
        param = loop_init_parameter(module, loop, index)
        name = entry_parameter_name(param) if param is not None else None
        if name:
            names[key] = name
    return names

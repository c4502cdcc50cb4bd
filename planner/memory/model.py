"""HBM per chip from propagated shardings: buffers, liveness and the peak.

Reported in XLA's own terms (compiled memory stats): arguments + outputs +
temporaries - aliased bytes, per device. Arguments are the entry parameters,
outputs the buffers the entry root returns, temporaries the peak of
everything else live at once, walking the entry computation in its order
(text order is the schedule; XLA:CPU runs each computation breadth-first,
`schedule.bfs_schedule`, the order kept in `MemoryEstimate.scheduled`). A While holds its carried buffers for the whole
loop and adds the peak of its body's own temporaries; a body's peak includes,
at each While nested in it (the layer scan inside a scan over microbatches),
that While's own body peak, innermost first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape, TupleShape
from planner.hlo.structure.inline import inline_calls
from planner.memory.buffers import (
    Buffer,
    Value,
    array_leaves,
    leaf_shardings,
    materialises,
    per_device_bytes,
    sharding_of,
)
from planner.memory.communication import Span, communication_buffers
from planner.memory.conversions import (
    hoisted_conversion_elements,
    read_at_half_precision,
    read_only_by_dots,
    updating_dot,
    widened_bytes,
)
from planner.memory.donation import ShapeIndex, leaf_indices
from planner.memory.heap_packing import layer_count, packing_bytes
from planner.memory.live_out_reuse import LiveOutAllocation, place_in_live_out_allocations
from planner.memory.loops_run_once import remove_loops_run_once
from planner.memory.schedule import bfs_schedule, with_schedule
from planner.memory.sparse_core import offloaded_gathers
from planner.memory.values import UnionFind, ValueModel, read_ends, reads_leaf
from planner.mesh import Mesh
from planner.propagation import PropagationResult
from planner.sharding.hlo_sharding import HloSharding, Kind
from planner.targets import Backend
from planner.targets import backend as backend_of


@dataclass
class MemoryEstimate:
    """Per-device bytes by category, and the buffers behind them."""

    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    buffers: list[Buffer]
    peak_position: int
    peak_buffers: list[Buffer]
    per_chip_bytes: dict[int, int] = field(default_factory=dict)
    # Temporaries at the peak that the backend keeps in on-chip memory rather than HBM.
    on_chip_bytes: int = 0
    # Each While body's peak of its own buffers, added at its While's position.
    body_peak_bytes: dict[str, int] = field(default_factory=dict)
    # Bytes per device in host memory at their peak (host offload), beside the HBM the totals count.
    host_bytes: int = 0
    # What the compiler's heap adds over the temporaries live at the peak (XLA:TPU: `heap_packing`), in temp_bytes.
    packing_bytes: int = 0
    # The module the positions above refer to (None: as given): the given one with its remaining calls
    # inlined and, for XLA:CPU, its entry in the order it runs it (breadth-first).
    scheduled: HloModule | None = None
    # (computation, instruction) computed inside its consumers by fusion (`ValueModel.fused`).
    fused: frozenset[tuple[str, str]] = frozenset()
    # Every temporary live at the peak, largest first: the entry's (`peak_buffers`) and, at a While there, its
    # body's at the body's own peak (a nested While's likewise). Their bytes add up to temp_bytes + on_chip_bytes.
    peak_temporaries: list[Buffer] = field(default_factory=list)
    # Ids of the entry's temporaries XLA:CPU holds in an output's or donated parameter's allocation, not its
    # heap (`live_out_reuse`): they add nothing to temp_bytes.
    in_live_out: frozenset[int] = frozenset()
    # One per root leaf that holds bytes of its own (a donated parameter's output holds none), and the root
    # tuple's table of pointers: their bytes add up to output_bytes - alias_bytes.
    outputs: list[Buffer] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes


def estimate_module(
    module: HloModule, result: PropagationResult, mesh: Mesh | None = None, target: str | Backend = "cpu"
) -> MemoryEstimate:
    """Per-device bytes of `module` as `target` compiles it, in the order that compiler would run it.

    XLA:CPU runs every computation breadth-first (`schedule.bfs_schedule`): the entry is measured in that
    order, each While body in its written order.
    """
    given = module
    # The calls left after propagation (a shard_map's body) are inlined before XLA assigns buffers: an
    # operand the body reads only early dies inside it, before the outputs it returns are written.
    module = inline_calls(module, which=lambda inst: inst.opcode == "call").module
    module = remove_loops_run_once(module, result)
    backend = backend_of(target)
    model = ValueModel(module, result, backend.compiler != "cpu", backend.all_reduces_in_place)
    model.build()
    if not backend.schedules_breadth_first:
        estimate = _estimate_in_order(module, result, mesh, target, model)
        if module is not given:
            estimate.scheduled = module
        return estimate
    # XLA decides which buffers share (copy insertion) before it schedules: the values and their
    # aliasing stay the program order's, only the positions move.
    entry = module.entry
    scheduled = with_schedule(module, {entry.name: bfs_schedule(entry, _held_by_consumers(entry, model))})
    estimate = _estimate_in_order(scheduled, result, mesh, target, model)
    # A loop body keeps its written order: breadth-first over the body as written, before fusion, runs its
    # residual slices and rematerialised forward earlier than XLA's fused body does (the CI grid's min-cut
    # torch_xla scan: +10.0% of XLA:CPU's bytes breadth-first, +3.8% as written).
    estimate.scheduled = scheduled
    return estimate


def _estimate_in_order(
    module: HloModule,
    result: PropagationResult,
    mesh: Mesh | None,
    target: str | Backend,
    model: ValueModel | None = None,
) -> MemoryEstimate:
    """`estimate_module` with every computation run in the order `module` gives it (`model`: its
    value model, when already built)."""
    backend = backend_of(target)
    if model is None:
        model = ValueModel(module, result, backend.compiler != "cpu", backend.all_reduces_in_place)
        model.build()
    uf = model.uf
    groups: dict[Value, list[Value]] = {}
    for v in model.size:
        groups.setdefault(uf.find(v), []).append(v)
    entry = module.entry
    positions = {inst.name: i for i, inst in enumerate(entry.instructions)}
    entry_reads_end = read_ends(entry, model.fused, positions)
    end_position = len(entry.instructions)
    # XLA copies a root element that is an entry parameter or appears twice, so
    # every root leaf is an output buffer of its own; a value that is returned
    # once (and is not a parameter) simply becomes that output buffer.
    root_keys = [uf.find((entry.name, entry.root_name, i)) for i in range(len(array_leaves(entry.root.shape)))]
    root_values = {k for k in root_keys if root_keys.count(k) == 1}
    buffers: list[Buffer] = []
    # (computation, dot) writing a half-float stacked buffer, and the f32 buffer XLA:CPU may accumulate it in.
    accumulators: list[tuple[tuple[str, str], int, str, ArrayShape, HloSharding | None, int]] = []
    body_peaks: dict[str, int] = {}
    by_key: dict[Value, Buffer] = {}
    host_keys = {uf.find(v) for v in model.host_starts}
    for key, members in groups.items():
        allocating = [v for v in members if v in model.allocating]
        if not allocating:
            continue
        size = max(model.size[v] for v in allocating)
        first = allocating[0]
        # The buffer is as large as its largest value (a carried element resharded inside its loop).
        largest = max(allocating, key=lambda v: model.size[v])
        stored, note = None, None
        if model.size[largest] != model.size[first]:
            stored, note = _held(*model.info[largest]), f"sized by its largest value, {largest[1]}"
        # A loop-carried buffer is best known by its place in the loop's tuple.
        carried = [v for v in allocating if v in model.loop_of]
        label = f"{carried[0][1]}[{carried[0][2]}]" if carried else first[1]
        shape, sharding = model.info[first]
        category = "temporary"
        if key in host_keys:
            category = HOST
        elif any(v[0] == entry.name and model.is_parameter(v) for v in allocating):
            category = "parameter"
        elif key in root_values:
            category = "output"
        elif any(v in model.loop_of for v in members):
            category = "loop-carried"
        loop = next((model.loop_of[v] for v in members if v in model.loop_of), None)
        half_float = backend.widens_half_floats and shape.element_type in ("bf16", "f16")
        dot = updating_dot(module, members) if half_float and loop is not None else None
        if category == "temporary":
            if widened_bytes(size, shape, backend) != size:
                size, stored, note = 2 * size, _as_f32(stored or _held(shape, sharding)), WIDENED
        elif (
            category == "loop-carried"
            and dot is not None
            and len({model.loop_of[v] for v in members if v in model.loop_of}) > 1
        ):
            # A dot result one loop saves for another (the forward's residual for the backward):
            # XLA:CPU stores the f32 product, the conversion moved past the update.
            size *= 2
            stored, note = _as_f32(stored or _held(shape, sharding)), "XLA:CPU saves the dot's f32 product"
        elif (
            category == "loop-carried"
            and backend.narrows_f32_dot_operands
            and shape.element_type == "f32"
            and read_only_by_dots(module, members)
        ):
            size //= 2
            shard = stored or _held(shape, sharding)
            stored = ArrayShape("bf16", shard.dims, layout=shard.layout)
            note = "XLA:TPU keeps an f32 value only dots read in bf16"
        device = sharding.device if sharding is not None and sharding.kind is Kind.MAXIMAL else None
        entry_members = [v for v in members if v[0] == entry.name]
        start = min((positions[v[1]] for v in entry_members), default=-1)
        end = start
        for v in entry_members:
            for user in entry.users(v[1]):
                if reads_leaf(entry, entry[user], v[2]):
                    end = max(end, entry_reads_end[user])
        buffer = Buffer(
            len(buffers), size, label, first[0], shape, sharding, category, device, start, end, loop, members,
            stored, note,
        )  # fmt: skip
        if dot is not None and loop in positions:
            accumulators.append((dot, 2 * size, f"{label} accumulated in f32", shape, sharding, positions[loop]))
        if start < 0:
            # Local to a While body: counted in that body's own peak.
            body_peaks.setdefault(first[0], 0)
        buffers.append(buffer)
        by_key[key] = buffer
        loops = sorted({positions[model.loop_of[v]] for v in members if model.loop_of.get(v) in positions})
        if (
            category == "parameter"
            and backend.narrows_f32_dot_operands
            and shape.element_type == "f32"
            and loops
            and read_at_half_precision(module, members)
        ):
            # An f32 parameter the loops read only at half precision (a scan's stacked master weights):
            # XLA:TPU converts it once before the first loop and the loops carry the bf16 copy (Mistral
            # 7B from MaxText: one bf16 copy per stacked MLP weight, half its size, live from the forward
            # loop to the end of the backward loop).
            shard = _held(shape, sharding)
            buffers.append(Buffer(len(buffers), size // 2, f"{label} at half precision", entry.name, shape,
                                  sharding, "temporary", device, loops[0], loops[-1],
                                  stored=ArrayShape("bf16", shard.dims, layout=shard.layout),
                                  note="XLA:TPU's bf16 copy for the loops"))  # fmt: skip
    # Buffers the SPMD partitioner adds around dots: gathered operands, unreduced results.
    communication = communication_buffers(module, result, model.walk_order(), backend)
    reduced = {(comp, span.dot) for comp, spans in communication.items() for span in spans
               if span.kind == "all-reduced result"}  # fmt: skip
    for dot, size, label, shape, sharding, at in accumulators:
        # XLA:CPU reduces a dot's partial sums in f32; the stacked buffer the reduced slices are written
        # into is then accumulated in f32 through the loop and converted once the loop is done.
        if dot in reduced:
            buffers.append(Buffer(len(buffers), size, label, entry.name, shape, sharding, "temporary", None, at, at,
                                  stored=_as_f32(_held(shape, sharding)), note=WIDENED))  # fmt: skip
    for span in communication.get(entry.name, []):
        buffers.append(_span_buffer(len(buffers), span, entry.name, span.start, span.end, backend))
    if backend.sparse_core_table_copies:
        # The SparseCores' gathers: their thread-local allocations are held for the whole step.
        for gather in offloaded_gathers(module, result, backend.sparse_core_min_table_bytes):
            buffers.append(Buffer(len(buffers), gather.thread_local_bytes(backend.sparse_core_table_copies),
                                  f"{gather.gather}: SparseCore's copies of its table", entry.name, gather.table,
                                  gather.table_sharding, "temporary", None, 0, end_position,
                                  note=f"{backend.sparse_core_table_copies} thread-local copies of the table, "
                                  "the indices likewise, and the rows gathered"))  # fmt: skip
    if backend.widens_half_floats:
        for loop_inst, leaf, sharding, size, label in hoisted_conversion_elements(module, result, model.walk_order()):
            if loop_inst.name in positions:
                at = positions[loop_inst.name]
                buffers.append(Buffer(len(buffers), size, label, entry.name, leaf, sharding, "temporary", None, at, at,
                                      note="what its f32 copy adds to the bf16 element"))  # fmt: skip
    # Body-local temporaries: their peak adds at the While's position, in the entry or in the body the
    # While is nested in. Innermost bodies first, so each outer body's peak holds its nested ones. What
    # holds each body's peak (its buffers live there, its nested Whiles' holders) is kept for the report.
    body_held: dict[str, list[Buffer]] = {}
    for comp_name in _innermost_first(module, model.body_of):
        local = [b for b in buffers if b.start < 0 and b.computation == comp_name and b.category != HOST]
        spans = communication.get(comp_name, [])
        made = [_span_buffer(-1, span, comp_name, -1, -1, backend) for span in spans]
        transient = [(span.start, span.end, b.size_bytes) for span, b in zip(spans, made)]
        comp = module.computation(comp_name)
        nested = _nested_peaks(comp, body_peaks, model.body_of)
        if local or transient or nested:
            body_peaks[comp_name], position, live = _local_peak(comp, local, transient, nested, model.fused)
            own = made + local
            body_held[comp_name] = [own[k] for k in live] + _nested_held(comp, position, body_held, model.body_of)
    extra_at = _nested_peaks(entry, body_peaks, model.body_of)
    temps = [b for b in buffers if b.start >= 0 and b.category in ("temporary", "loop-carried")]
    in_live_out: frozenset[int] = frozenset()
    if backend.temporaries_in_live_out_allocations:
        allocations = _live_out_allocations(module, model.output_parameters, root_keys, by_key, uf, end_position)
        placed = place_in_live_out_allocations(temps, allocations)
        in_live_out = frozenset(temps[k].id for k in placed)
        temps = [b for b in temps if b.id not in in_live_out]
    entry_spans = [(b.start, b.end, b.size_bytes) for b in temps]
    peak, peak_position = peak_of_spans(entry_spans, end_position, extra_at)
    peak_temporaries = [temps[k] for k in live_at(entry_spans, peak_position, end_position)]
    peak_temporaries += _nested_held(entry, peak_position, body_held, model.body_of)
    # What on-chip memory holds at the peak is not HBM.
    on_chip = min(peak, backend.alternate_memory_bytes)
    peak -= on_chip
    # XLA:TPU's heap is larger than its live peak by what packing its buffers costs (`heap_packing`).
    packing = packing_bytes(peak, layer_count(module)) if backend.compiler == "tpu" else 0
    peak += packing
    argument = sum(b.size_bytes for b in buffers if b.category == "parameter")
    root_shardings = leaf_shardings(entry.root.shape, sharding_of(result, entry.root_name))
    output = sum(per_device_bytes(leaf, s) for leaf, s in zip(array_leaves(entry.root.shape), root_shardings))
    # The root tuple's own table of pointers, one per element.
    output += 8 * len(array_leaves(entry.root.shape)) if isinstance(entry.root.shape, TupleShape) else 0
    peak_buffers = sorted((b for b in temps if b.start <= peak_position <= b.end), key=lambda b: -b.size_bytes)
    # Donated parameters share their buffer with an output: those input_output_alias ties, and those XLA pairs
    # with a registered buffer donor.
    alias = sum(
        per_device_bytes(leaf, s)
        for k, (leaf, s) in enumerate(zip(array_leaves(entry.root.shape), root_shardings))
        if k in model.outputs_in_parameters
    )
    # Host memory: the offloaded buffers live together at their own peak, the entry's, plus what a body
    # offloads for itself.
    host = [b for b in buffers if b.category == HOST]
    host_peak, _ = peak_of_spans([(b.start, b.end, b.size_bytes) for b in host if b.start >= 0], end_position, {})
    host_peak += sum(b.size_bytes for b in host if b.start < 0)
    estimate = MemoryEstimate(argument, output, peak, alias, buffers, peak_position, peak_buffers,
                              on_chip_bytes=on_chip, body_peak_bytes=body_peaks,
                              fused=frozenset(model.fused), host_bytes=host_peak, packing_bytes=packing)  # fmt: skip
    estimate.peak_temporaries = sorted(peak_temporaries, key=lambda b: -b.size_bytes)
    estimate.in_live_out = in_live_out
    estimate.outputs = _output_buffers(entry, root_keys, root_shardings, by_key, model.outputs_in_parameters)
    devices = mesh.device_ids if mesh is not None else tuple(range(_num_devices(result)))
    outputs = [
        (per_device_bytes(leaf, s), s.device if s is not None and s.kind is Kind.MAXIMAL else None)
        for leaf, s in zip(array_leaves(entry.root.shape), root_shardings)
    ]
    estimate.per_chip_bytes = _per_chip(estimate, devices, outputs)
    return estimate


WIDENED = "XLA:CPU computes bf16 work in f32"
HOST = "host"  # a buffer XLA's host offloader places in host memory


def _held(shape: ArrayShape, sharding: HloSharding | None) -> ArrayShape:
    """The per-device array of `shape` under `sharding`."""
    if sharding is None or sharding.kind is not Kind.TILED:
        return shape
    return ArrayShape(shape.element_type, sharding.shard_shape(shape.dims), layout=shape.layout)


def _as_f32(array: ArrayShape) -> ArrayShape:
    return ArrayShape("f32", array.dims, layout=array.layout)


def _span_buffer(id: int, span: Span, computation: str, start: int, end: int, backend: Backend) -> Buffer:
    """A buffer the partitioner adds (`communication_buffers`), as the backend allocates it. It exists only
    per device: its shape is the per-device one, with no sharding."""
    size = widened_bytes(span.size_bytes, span.shape, backend)
    shape = span.held if span.held is not None else span.shape
    stored: ArrayShape | None = None
    note = None if span.held is not None else "its per-device shape is not modelled"
    if size != span.size_bytes:
        stored, note = _as_f32(shape), WIDENED
    return Buffer(id, size, span.label, computation, shape, None, "temporary", None, start, end,
                  stored=stored, note=note)  # fmt: skip


def _nested_held(
    comp: Computation, position: int, body_held: dict[str, list[Buffer]], body_of: dict[str, Instruction]
) -> list[Buffer]:
    """What the bodies (and conditions) of a While at `position` in `comp` hold at their own peaks."""
    if not 0 <= position < len(comp.instructions):
        return []
    at = comp.instructions[position]
    return [b for body, held in body_held.items() if body_of.get(body) is at for b in held]


def _held_by_consumers(comp: Computation, model: ValueModel) -> set[str]:
    """`comp`'s instructions with no buffer of their own: views, and ops fusion computes in their consumers."""
    return {inst.name for inst in comp.instructions if not materialises(comp, inst, model.accelerator)}


def _live_out_allocations(
    module: HloModule,
    pairs: dict[int, tuple[int, ShapeIndex]],
    root_keys: list[Value],
    by_key: dict[Value, Buffer],
    uf: UnionFind,
    end_position: int,
) -> list[LiveOutAllocation]:
    """The entry's outputs' allocations as XLA:CPU's buffer assignment makes them: each busy from the write of
    its output to the end of the step and, for an output written into a donated parameter, from the
    parameter's first to its last read as well."""
    entry = module.entry
    parameters = {inst.parameter_number: inst for inst in entry.parameters}
    allocations = []
    for k, key in enumerate(root_keys):
        output = by_key.get(key)
        if output is None or output.category != "output" or root_keys.count(key) != 1:
            continue
        allocation = LiveOutAllocation(output.size_bytes, [(output.start, end_position)])
        number, index = pairs.get(k, (None, ()))
        param = parameters.get(number)
        if param is not None and index in leaf_indices(param.shape):
            donor = by_key.get(uf.find((entry.name, param.name, leaf_indices(param.shape).index(index))))
            if donor is not None:
                allocation.size_bytes = max(allocation.size_bytes, donor.size_bytes)
                allocation.busy.append((donor.start, donor.end))
        allocations.append(allocation)
    return allocations


def _output_buffers(
    entry: Computation,
    root_keys: list[Value],
    root_shardings: list[HloSharding | None],
    by_key: dict[Value, Buffer],
    aliased: set[int],
) -> list[Buffer]:
    """`MemoryEstimate.outputs`: each root leaf, named by the buffer it is (or is copied from)."""
    leaves = array_leaves(entry.root.shape)
    found = []
    for k, (leaf, s) in enumerate(zip(leaves, root_shardings)):
        if k in aliased:
            continue
        source = by_key.get(root_keys[k])
        label, loop, values = f"{entry.root_name}[{k}]", None, []
        if source is not None:
            # A parameter, or a value returned twice, is copied into an output buffer of its own.
            label = source.defined_by if source.category == "output" else f"copy of {source.defined_by}"
            loop, values = source.loop, source.values
        device = s.device if s is not None and s.kind is Kind.MAXIMAL else None
        found.append(Buffer(-1, per_device_bytes(leaf, s), label, entry.name, leaf, s, "output", device, -1, -1,
                            loop, values))  # fmt: skip
    if isinstance(entry.root.shape, TupleShape):
        table = ArrayShape("u64", (len(leaves),))
        found.append(Buffer(-1, table.byte_size, entry.root_name, entry.name, table, None, "output",
                            note="the output tuple's table of pointers, one per element"))  # fmt: skip
    return found


def _innermost_first(module: HloModule, body_of: dict[str, Instruction]) -> list[str]:
    """Every While body and condition, the most deeply nested first (program order among equals)."""
    owner_of = {inst.name: comp.name for comp in module.computations for inst in comp.instructions
                if inst.opcode == "while"}  # fmt: skip
    return sorted(body_of, key=lambda c: -_depth(c, body_of, owner_of))


def _depth(comp: str, body_of: dict[str, Instruction], owner_of: dict[str, str]) -> int:
    """How many Whiles a computation is nested in (the entry: 0)."""
    depth = 0
    while comp in body_of and depth < 64:
        comp, depth = owner_of[body_of[comp].name], depth + 1
    return depth


def _nested_peaks(comp: Computation, body_peaks: dict[str, int], body_of: dict[str, Instruction]) -> dict[int, int]:
    """{position of a While in `comp`: its body's and condition's peaks}."""
    positions = {inst.name: i for i, inst in enumerate(comp.instructions)}
    extra: dict[int, int] = {}
    for body, peak in body_peaks.items():
        owner = body_of.get(body)
        if owner is not None and owner.name in positions and comp[owner.name] is owner:
            extra[positions[owner.name]] = extra.get(positions[owner.name], 0) + peak
    return extra


def _local_peak(
    comp: Computation,
    buffers: list[Buffer],
    transient: list[tuple[int, int, int]],
    nested: dict[int, int],
    fused: set[tuple[str, str]] | frozenset[tuple[str, str]],
) -> tuple[int, int, list[int]]:
    """(bytes, position, live): the body's peak of its own buffers, the partitioner's (start, end, bytes)
    spans and, at each While nested in it, that While's body peak; where it is; and which of the spans,
    then the buffers, are live there (by index into `transient + buffers`)."""
    positions = {inst.name: i for i, inst in enumerate(comp.instructions)}
    ends = read_ends(comp, fused, positions)
    spans = list(transient)
    for b in buffers:
        spans.append((*body_span(comp, positions, b, ends), b.size_bytes))
    peak, position = peak_of_spans(spans, len(comp.instructions), nested)
    return peak, position, live_at(spans, position, len(comp.instructions))


def body_span(comp: Computation, positions: dict[str, int], buffer: Buffer, ends: dict[str, int]) -> tuple[int, int]:
    """(first, last) position in `comp` at which a buffer local to it is live: from its first value's
    definition to the last instruction that reads one of its values (`reads_leaf`), where the read
    ends (`read_ends`)."""
    defined = [v for v in buffer.values if v[0] == comp.name]
    start = min(positions[v[1]] for v in defined)
    end = max([start] + [ends[u] for v in defined for u in comp.users(v[1]) if reads_leaf(comp, comp[u], v[2])])
    return start, end


def peak_of_spans(
    spans: list[tuple[int, int, int]], num_positions: int, extra_at: dict[int, int] | None = None
) -> tuple[int, int]:
    """(bytes, position): the most bytes live at one position and the first position holding them, each
    span (start, end, bytes) live from start to end inclusive, plus `extra_at[p]` bytes at position p.

    One sweep over the spans' start and end events, not positions x spans: the bytes live at p are the
    sum of the deltas up to p (+bytes at start, -bytes just after end).
    """
    if num_positions <= 0:
        return 0, 0
    delta = [0] * (num_positions + 1)
    for start, end, size in spans:
        if end < start or start >= num_positions:
            continue  # live at no position, as a span that ends before it starts
        delta[max(start, 0)] += size
        delta[min(end, num_positions - 1) + 1] -= size
    extra = extra_at or {}
    peak = position = live = 0
    for p in range(num_positions):
        live += delta[p]
        here = live + extra.get(p, 0)
        if here > peak:
            peak, position = here, p
    return peak, position


def live_at(spans: list[tuple[int, int, int]], position: int, num_positions: int) -> list[int]:
    """The spans (start, end, bytes) `peak_of_spans` counts at `position`, by index."""
    return [
        k
        for k, (start, end, _) in enumerate(spans)
        if start <= end and start < num_positions and max(start, 0) <= position <= min(end, num_positions - 1)
    ]


def _num_devices(result: PropagationResult) -> int:
    for inst in result.instructions:
        s = inst.sharding
        for leaf in s.elements if s is not None and s.is_tuple else (s,):
            if leaf is not None and leaf.tile_assignment is not None:
                return leaf.tile_assignment.num_devices
    return 1


def _per_chip(
    estimate: MemoryEstimate, devices: tuple[int, ...], outputs: list[tuple[int, int | None]]
) -> dict[int, int]:
    """Every chip holds every buffer, except parameters and outputs pinned to one device.

    `outputs` lists (bytes, device or None) per root leaf.
    """
    per_chip = {d: estimate.temp_bytes - estimate.alias_bytes for d in devices}
    for b in estimate.buffers:
        if b.category == "parameter":
            for d in devices if b.device is None else (b.device,):
                if d in per_chip:
                    per_chip[d] += b.size_bytes
    table = estimate.output_bytes - sum(size for size, _ in outputs)  # the root tuple's pointer table
    for d in per_chip:
        per_chip[d] += table
    for size, device in outputs:
        for d in devices if device is None else (device,):
            if d in per_chip:
                per_chip[d] += size
    return per_chip

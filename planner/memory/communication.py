"""Buffers the SPMD partitioner adds around dots, and when they are live.

A dot whose operands are not split the way its partition needs them (`dot_partition`) reads a
gathered copy of an operand; a dot whose result holds partial sums, or is computed larger than its
sharding, writes that result whole before it is reduced or sliced. Each becomes a span of positions
in its computation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.hlo.structure.frontend import is_torch_xla_module
from planner.memory.buffers import per_device_bytes, sharding_of
from planner.memory.dot_partition import DotPartition, partition_dot
from planner.memory.windowed_einsum import Window, windowed_einsum
from planner.propagation import PropagationResult, dot_dims
from planner.targets import Backend
from planner.targets import backend as target_backend


def issues_weight_gathers_first(module: HloModule) -> bool:
    """Whether a loop body's weight gathers are held from the top of the body.

    jaxlib's XLA:CPU issues every gather of the layer's weights there. torch_xla 2.9 compiles with the
    XLA it bundles, whose schedule interleaves each gather with its use. XLA:TPU's latency-hiding
    scheduler starts each gather a few positions before its dot but also reorders the body: its
    backward body runs the rematerialised forward dots first, so the layer's gathered weights are held
    together (Llama 3.1 405B on v6e-256: its three MLP weights' gathers live across positions 724-749,
    735-754 and 744-746 of the body). The body as JAX writes it interleaves those dots with the backward
    ones; a gather held from the top of the body stands for that overlap.
    """
    return not is_torch_xla_module(module)


def _from_parameter_only(comp: Computation) -> set[str]:
    """Values a body computes from its parameter alone (the layer's weights, sliced by the counter).

    XLA's scheduler can issue their gathers at the top of the body, and on CPU it does.
    """
    found: set[str] = set()
    for inst in comp.instructions:
        computed_from_parameter = bool(inst.operands) and all(o in found for o in inst.operands)
        if inst.opcode in ("parameter", "constant", "iota") or computed_from_parameter:
            found.add(inst.name)
    return found


SPAN_KINDS = ("gathered", "result before reduction", "all-reduced result", "partial sums", "windowed einsum")


@dataclass(frozen=True)
class Span:
    """A buffer the SPMD partitioner adds for `dot`, live from `start` to `end` (positions in its computation)."""

    start: int
    end: int
    size_bytes: int
    dot: str
    kind: str  # one of SPAN_KINDS
    shape: ArrayShape  # the dot's: its element type is the one the backend computes in
    operand: str | None = None  # what a gather gathers
    # What each device holds, as one array (before the backend widens it): the gathered operand's or the
    # result's per-device shape, a windowed einsum's shards stacked; `size_bytes` is its size.
    held: ArrayShape | None = None

    def __post_init__(self) -> None:
        assert self.kind in SPAN_KINDS, self.kind

    @property
    def label(self) -> str:
        return f"{self.dot}: {self.kind}" + (f" {self.operand}" if self.operand else "")


def communication_buffers(
    module: HloModule,
    result: PropagationResult,
    computations: list[str],
    backend: Backend | None = None,
) -> dict[str, list[Span]]:
    """What partitioning a dot allocates, per computation.

    An operand sharded on a dim the output does not split must be gathered first (FSDP's weight
    all-gather). The all-gather is issued as soon as its operand exists (XLA's schedulers start
    collectives early; in a loop body every weight's gather sits at the top), and dots that need the
    same operand gathered the same way share one gather (XLA's CSE). A result whose operands leave it
    less split than its own sharding is computed whole, then reduced or sliced. Per `backend`
    (XLA:CPU's by default): with its windowed-einsum thresholds (XLA:TPU's, per group size), a dot the
    partitioner makes a windowed einsum holds the loop's shards instead (`windowed_einsum`), unless
    another dot shares its gather; where its all-reduce writes over the partial sums, a reduced result
    holds no second buffer; except on XLA:TPU, a body's gathers are held until its last reduction.
    """
    backend = backend if backend is not None else target_backend("cpu")
    out: dict[str, list[Span]] = {}
    for name in computations:
        comp = module.computation(name)
        positions = {inst.name: k for k, inst in enumerate(comp.instructions)}
        # In a loop body the gathers of the layer's weights are issued at the top; in the entry
        # computation (an unrolled loop) each layer's gathers stay with their layer. Other gathers
        # start where their operand is computed.
        early = name != module.entry_name and issues_weight_gathers_first(module)
        invariant = _from_parameter_only(comp) if early else set()
        gathers: dict[tuple[str, int], Span] = {}
        spans: list[Span] = []
        dots = _partitioned_dots(comp, result, backend.windowed_einsum_thresholds)
        # How many dots read each gathered operand: a gather two dots share is not windowed.
        sharing: dict[tuple[str, int], int] = {}
        for _, inst, plan, _ in dots:
            for read, need in zip(inst.operands[:2], plan.operand_bytes):
                if need > per_device_bytes(comp[read].array_shape, sharding_of(result, read)):
                    sharing[(read, need)] = sharing.get((read, need), 0) + 1
        for pos, inst, plan, window in dots:
            lhs, rhs = comp[inst.operands[0]], comp[inst.operands[1]]
            shape = inst.array_shape
            output = sharding_of(result, inst.name)
            if window is not None:
                looped = inst.operands[window.operand] if window.operand is not None else None
                if looped is None or sharing[(looped, plan.operand_bytes[window.operand or 0])] == 1:
                    spans.append(Span(pos, pos, window.size_bytes, inst.name, "windowed einsum", shape, looped,
                                      window.held))  # fmt: skip
                    continue
            for operand, need, dims in zip((lhs, rhs), plan.operand_bytes, plan.operand_shard_shapes):
                if need > per_device_bytes(operand.array_shape, sharding_of(result, operand.name)):
                    key = (operand.name, need)
                    earlier = gathers.get(key)
                    start = earlier.start if earlier else (0 if operand.name in invariant else positions[operand.name])
                    gathered = replace(operand.array_shape, dims=dims, dynamic=())
                    gathers[key] = Span(start, pos, need, inst.name, "gathered", shape, operand.name, gathered)
            whole = replace(shape, dims=plan.result_shard_shape, dynamic=())
            result_bytes = plan.result_bytes
            if result_bytes > per_device_bytes(shape, output):
                spans.append(Span(pos, pos, result_bytes, inst.name, "result before reduction", shape, None, whole))
                if plan.partial and not backend.all_reduces_in_place:
                    # Partial sums: the all-reduce writes a second buffer before the result is sliced.
                    spans.append(Span(pos, pos, result_bytes, inst.name, "all-reduced result", shape, None, whole))
            elif plan.partial:
                # Partial sums the all-reduce turns into the result: the dot writes them first.
                spans.append(Span(pos, pos, result_bytes, inst.name, "partial sums", shape, None, whole))
        if early and spans and backend.compiler != "tpu":
            # XLA:CPU interleaves the layer's weight-gradient partial sums with its gathered weights: a
            # weight's gather stays live until the last partial sum of the body has been reduced (XLA:GPU's
            # steps are prepared and sized as XLA:CPU's).
            # XLA:TPU frees a gather after its last dot, and the partial sums reuse its allocation
            # (Llama 3.1 405B: the gathered MLP weight and a weight gradient's partial sums and
            # all-reduce share one 1,664 MiB allocation).
            last = max((span.end for span in spans if span.kind != "windowed einsum"), default=0)
            gathers = {k: replace(g, end=max(g.end, last)) if k[0] in invariant else g for k, g in gathers.items()}
        if gathers or spans:
            out[name] = list(gathers.values()) + spans
    return out


def _partitioned_dots(
    comp: Computation, result: PropagationResult, thresholds: Mapping[int, int]
) -> list[tuple[int, Instruction, DotPartition, Window | None]]:
    """Each array dot of `comp` with its position, its partition and the windowed einsum it may become."""
    found = []
    for pos, inst in enumerate(comp.instructions):
        if inst.opcode != "dot":
            continue
        output = sharding_of(result, inst.name)
        if output is None or output.is_tuple:
            continue
        lhs, rhs = comp[inst.operands[0]], comp[inst.operands[1]]
        if not isinstance(lhs.shape, ArrayShape) or not isinstance(rhs.shape, ArrayShape):
            continue
        shapes = (lhs.shape, rhs.shape, inst.array_shape)
        shardings = (sharding_of(result, lhs.name), sharding_of(result, rhs.name), output)
        plan = partition_dot(dot_dims(inst, lhs.shape.rank, rhs.shape.rank), shapes, shardings)
        found.append((pos, inst, plan, windowed_einsum(plan, shapes, shardings, thresholds) if thresholds else None))
    return found

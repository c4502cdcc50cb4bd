"""Dots XLA:TPU computes as windowed einsums: a loop over shards in place of a whole gather or partial sum.

XLA's SPMD partitioner (`GetWindowedEinsumConfiguration` in its dot handler) turns a dot into a loop
of collective-permutes when the dot's one communication runs over every device of its group:
- all-gather: one operand is split over devices that the output splits on the other operand's dims
  (FSDP's weight against batch-split activations). Each iteration multiplies the shard a device holds
  and passes it on: the whole operand is never gathered.
- reduce-scatter: both operands are split on a contracting dim over devices that the output splits on
  a free dim (FSDP's weight gradient). Each iteration computes one output shard's partial sums and
  passes the accumulator on: the whole partial sum is never written.
The partitioner's size test (`threshold_for_windowed_einsum_mib`) is -1 MiB in libtpu's flags
(`xla_jf_spmd_threshold_for_windowed_einsum_mib`), with both kinds enabled. Three things still decline
a loop. An operand that another dot needs gathered the same way is not windowed: `check_users_sharding`
keeps one gather both share. A group of more than 32 devices is not (`kMaxIterations`). And the
partitioner's cost check keeps a loop only when overlapping the dot with its collective-permutes beats
the dot and the collective run one after the other (`disable_windowed_einsum`: max(compute,
m x comm) + 2 x m x comm / N against compute + comm, m libtpu's communication multiplier). Compute
over communication is the dot's FLOPs per byte of the collective (the gathered operand, or the partial
sums reduced), so libtpu's answer is a threshold on that ratio for each chip and group size. Measured
with libtpu 0.0.20 and 0.0.50 (the same answers) by compiling FSDP dots of bf16 and f32 at growing
tokens per device until the loop appears, all-gathers and reduce-scatters alike
(`WINDOWED_EINSUM_FLOPS_PER_BYTE` in `planner.targets`). No group of 4 or fewer devices is ever
windowed there, at any size: the multiplier is at least 2, and m >= N/2 leaves nothing to gain.

What a loop holds besides its operands and result, read from XLA:TPU's buffer assignment of its
bidirectional loops (libtpu's default): for an all-gather, the operand's shard twice (one copy per
direction) and two more in flight; for a reduce-scatter, two accumulators, two in flight and the
iteration's two partial products, each the size of the output's shard.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from planner.hlo.ir.shapes import ArrayShape
from planner.memory.buffers import per_device_bytes
from planner.memory.dot_partition import DotPartition, axis_grouping
from planner.sharding.hlo_sharding import HloSharding, Kind

SHARDS_HELD = {"all-gather": 4, "reduce-scatter": 6}


@dataclass(frozen=True)
class Window:
    kind: str  # "all-gather" | "reduce-scatter"
    operand: int | None  # which operand an all-gather loops over
    size_bytes: int  # what the loop holds besides the dot's operands and result
    # The same per device as one array: [shards held, *one shard's dims] (all-gather: 4 x bf16[512,1024]
    # of the operand's shard is bf16[4,512,1024]).
    held: ArrayShape | None = None


def _shards(count: int, shape: ArrayShape, sharding: HloSharding | None) -> ArrayShape:
    """`count` per-device shards of `shape` under `sharding`, stacked on a leading dim."""
    dims = sharding.shard_shape(shape.dims) if sharding is not None and sharding.kind is Kind.TILED else shape.dims
    return ArrayShape(shape.element_type, (count, *dims), layout=shape.layout)


def _output_groupings(shape: ArrayShape, sharding: HloSharding | None) -> set[object]:
    return {g for d in range(shape.rank) if (g := axis_grouping(sharding, d)) is not None}


def _devices(groupings: frozenset[frozenset[frozenset[int]]]) -> int:
    """How many devices a collective over these mesh axes spans: the product of their tile counts."""
    n = 1
    for grouping in groupings:
        n *= len(grouping)
    return n


def _worth_it(flops: int, collective_bytes: int, group: int, thresholds: Mapping[int, int]) -> bool:
    threshold = thresholds.get(group)
    return threshold is not None and flops >= threshold * collective_bytes


def windowed_einsum(
    plan: DotPartition,
    shapes: tuple[ArrayShape, ArrayShape, ArrayShape],
    shardings: tuple[HloSharding | None, HloSharding | None, HloSharding | None],
    thresholds: Mapping[int, int],
) -> Window | None:
    """The loop XLA:TPU's partitioner makes of this dot, or None when it communicates otherwise.

    `thresholds`: per group size, the FLOPs per byte of collective at which the chip's cost model
    keeps the loop (none: never)."""
    out_shape, out = shapes[2], shardings[2]
    out_bytes = per_device_bytes(out_shape, out)
    held = [per_device_bytes(shapes[k], shardings[k]) for k in (0, 1)]
    gathered = [k for k in (0, 1) if plan.operand_bytes[k] > held[k]]
    splits_output = _output_groupings(out_shape, out)
    if len(gathered) == 1 and not plan.partial and plan.result_bytes == out_bytes:
        k = gathered[0]
        group = _devices(plan.gathered_over[k])
        if (
            plan.gathered_over[k]
            and plan.gathered_over[k] <= splits_output
            and _worth_it(plan.flops, plan.operand_bytes[k], group, thresholds)
        ):
            count = SHARDS_HELD["all-gather"]
            return Window("all-gather", k, count * held[k], _shards(count, shapes[k], shardings[k]))
    scattered = _devices(plan.reduced_over)
    # The output is the partial sums reduced and scattered over the contraction's devices, nothing more.
    if (
        not gathered
        and plan.partial
        and plan.result_bytes == scattered * out_bytes
        and plan.reduced_over <= splits_output
        and _worth_it(plan.flops, plan.result_bytes, scattered, thresholds)
    ):
        count = SHARDS_HELD["reduce-scatter"]
        return Window("reduce-scatter", None, count * out_bytes, _shards(count, out_shape, out))
    return None

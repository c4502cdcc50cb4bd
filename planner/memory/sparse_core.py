"""Gathers XLA:TPU runs on the chip's SparseCores, and the HBM their computations hold of their own.

v6e and v5p chips carry SparseCores beside their TensorCore; v5e chips have none. libtpu offloads a
gather of whole table rows (an embedding lookup: rows of a rank-2 table picked by a vector of indices) to
them: an async computation on the `sparsecore` thread that calls the gather's fusion
(`gather_offload_custom_fusion` in its dumps, `"offload":"OFFLOAD_GATHER"`).

Since libtpu 0.0.52 its buffer assignment gives those nested computations' buffers allocations of their
own, marked thread-local, outside the heap and held for the whole step: the table once per level of the
nesting (the async computation, the call, the fusion: three copies), the indices likewise, and the
fusion's result once. libtpu 0.0.50.1 compiles the same offload with the table and result in the heap,
live only around the gather.

Not every row gather is offloaded. On v6e a table of 31.3 MiB per device or less is not: the embedding
tables of 31.25 and 31.3 MiB (Mixtral 8x7B on v6e-8, Llama 3 8B on v6e-32, Llama 3.1 70B on v6e-64) and
DeepSeek-V2's 24 MiB expert-routing gathers (v6e-16) hold no thread-local table; tables of 62.6 MiB and more
(Llama 3 8B on v6e-16 and v6e-8, Gemma 2 9B, Gemma 3 4B, Qwen3 8B) hold three. On v5p the floor lies between
Llama 2 70B's 7.8 MiB embedding shard on v5p-128, which holds none, and Mixtral's 16 MiB expert-routing tables
(v5p-8, v5p-16), which hold three, as DeepSeek-V2's 24 MiB ones on v5p-16 do. Each chip's floor
(`Backend.sparse_core_min_table_bytes`: 32 MiB on v6e, 8 MiB on v5p) is a round number inside its measured
bracket, not libtpu's own constant, which its dumps do not show.

DeepSeek-V2's c64[163840,32] rotary table (40 MiB, replicated), gathered four times a step, holds no thread-local
copy on v6e-16 or v5p-16, where its 24 MiB bf16 routing tables and its embedding table on v5p-16 hold three each.
The model keeps a complex table on the TensorCore; its rows, 32 wide, might be the reason instead, and no other
step tells the two apart. The tables and rows are held in XLA:TPU's tiled layout (`tpu_tiling`): Gemma 3 4B's
bf16[262144,320] shard holds 192 MiB, its 320 columns padded to 384.

Measured on MaxText's Llama 3 8B step (v6e-8, fsdp 8): three allocations of bf16[128256,512]
(125.25 MiB each, the bf16 table's shard), one of bf16[16384,512] (16 MiB, the looked-up rows) and three
of s32[16384]: 392 MiB, the difference between libtpu 0.0.52's HBM total and 0.0.50.1's on that step
beside a heap 0.1 GiB larger. Mixtral 8x7B (v5p-8) likewise holds three copies of its table's shard.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.hlo.ir.module import HloModule, Instruction
from planner.hlo.ir.shapes import ELEMENT_BITS, ArrayShape
from planner.memory.buffers import per_device_bytes, sharding_of
from planner.memory.tpu_tiling import tiled_bytes
from planner.propagation import PropagationResult
from planner.sharding.hlo_sharding import HloSharding, Kind


@dataclass(frozen=True)
class OffloadedGather:
    """A gather XLA:TPU runs on the SparseCores, and the bytes per device of what it reads and writes."""

    computation: str
    gather: str
    table: ArrayShape
    table_sharding: HloSharding | None
    table_bytes: int
    indices_bytes: int
    result_bytes: int

    def thread_local_bytes(self, copies: int) -> int:
        """What the offload's thread-local allocations hold: `copies` of the table and indices, one result."""
        return copies * (self.table_bytes + self.indices_bytes) + self.result_bytes


# Element types whose tables stay on the TensorCore (measured: DeepSeek-V2's c64 rotary table).
_NOT_OFFLOADED_TYPES = frozenset({"c64", "c128"})


def is_row_gather(inst: Instruction, operand: Instruction) -> bool:
    """A gather of whole rows of a rank-2 real table, one row per index: what libtpu offloads to SparseCore."""
    if inst.opcode != "gather" or not isinstance(operand.shape, ArrayShape) or operand.shape.rank != 2:
        return False
    if operand.shape.element_type in _NOT_OFFLOADED_TYPES:
        return False
    slice_sizes = tuple(inst.attr("slice_sizes", ()))
    return (
        tuple(inst.attr("collapsed_slice_dims", ())) == (0,)
        and tuple(inst.attr("start_index_map", ())) == (0,)
        and slice_sizes == (1, operand.shape.dims[1])
        and not inst.attr("operand_batching_dims", ())
    )


def offloaded_gathers(module: HloModule, result: PropagationResult, min_table_bytes: int = 0) -> list[OffloadedGather]:
    """Every row gather of `module` whose table holds more than `min_table_bytes` per device, each once wherever
    it runs (a loop body's is one computation). The table's and the rows' bytes are those of XLA:TPU's tiled
    row-major layout (`tpu_tiling`), as its thread-local allocations hold them."""
    found = []
    for comp in module.computations:
        for inst in comp:
            if inst.opcode != "gather":
                continue
            table, indices = comp.operands(inst)[:2]
            if not is_row_gather(inst, table):
                continue
            assert isinstance(table.shape, ArrayShape)
            table_sharding = sharding_of(result, table.name)
            if per_device_bytes(table.shape, table_sharding) <= min_table_bytes:
                continue
            rows, columns = _table_shard(table.shape, table_sharding)
            num_indices = _num_indices(indices, table_sharding, result)
            found.append(
                OffloadedGather(
                    comp.name,
                    inst.name,
                    table.shape,
                    table_sharding,
                    tiled_bytes(table.shape.element_type, (rows, columns)),
                    num_indices * ELEMENT_BITS[_element_type(indices)] // 8,
                    tiled_bytes(table.shape.element_type, (num_indices, columns)),
                )
            )
    return found


def _table_shard(table: ArrayShape, sharding: HloSharding | None) -> tuple[int, int]:
    """The (rows, columns) of the table each device holds."""
    rows, columns = sharding.shard_shape(table.dims) if sharding is not None else table.dims
    return rows, columns


def _num_indices(indices: Instruction, table_sharding: HloSharding | None, result: PropagationResult) -> int:
    """How many rows each device gathers. From a table split across devices every device gathers every index
    from its own shard (the partitioner replicates the indices and masks the rows it does not hold): MaxText's
    Llama 3 8B on v6e-8, its table split along its columns, gathers s32[16384], all 8 x 2,048 tokens, into
    bf16[16384,512]; split along rows and columns (fsdp 4 x tp 2), bf16[16384,1024]. Otherwise (a replicated
    table, or a manual computation's) the indices the device itself holds."""
    if not isinstance(indices.shape, ArrayShape):
        return 0
    if table_sharding is not None and table_sharding.kind is Kind.TILED:
        return math.prod(indices.shape.dims)
    sharding = sharding_of(result, indices.name)
    dims = sharding.shard_shape(indices.shape.dims) if sharding is not None else indices.shape.dims
    return math.prod(dims)


def _element_type(inst: Instruction) -> str:
    assert isinstance(inst.shape, ArrayShape)
    return inst.shape.element_type

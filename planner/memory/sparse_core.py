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

Not every row gather is offloaded. On v6e only a table of more than 32 MiB per device is: the embedding
tables of 31.25 and 31.3 MiB (Mixtral 8x7B on v6e-8, Llama 3 8B on v6e-32, Llama 3.1 70B on v6e-64) and
DeepSeek-V2's 24 MiB expert-routing gathers (v6e-16) hold no thread-local table; tables of 62.6 MiB and more
(Llama 3 8B on v6e-16 and v6e-8, Gemma 2 9B, Gemma 3 4B, Qwen3 8B) hold three. On v5p every one is, down
to Mixtral's 16 MiB expert-routing gathers (v5p-8, v5p-16) and DeepSeek-V2's 24 MiB ones on v5p-16
(`Backend.sparse_core_min_table_bytes`).

Measured on MaxText's Llama 3 8B step (v6e-8, fsdp 8): three allocations of bf16[128256,512]
(125.25 MiB each, the bf16 table's shard), one of bf16[16384,512] (16 MiB, the looked-up rows) and three
of s32[16384]: 392 MiB, the difference between libtpu 0.0.52's HBM total and 0.0.50.1's on that step
beside a heap 0.1 GiB larger. Mixtral 8x7B (v5p-8) likewise holds three copies of its table's shard.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.hlo.ir.module import HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.memory.buffers import per_device_bytes, sharding_of
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


def is_row_gather(inst: Instruction, operand: Instruction) -> bool:
    """A gather of whole rows of a rank-2 table, one row per index: what libtpu offloads to SparseCore."""
    if inst.opcode != "gather" or not isinstance(operand.shape, ArrayShape) or operand.shape.rank != 2:
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
    it runs (a loop body's is one computation)."""
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
            table_bytes = per_device_bytes(table.shape, table_sharding)
            if table_bytes <= min_table_bytes:
                continue
            found.append(
                OffloadedGather(
                    comp.name,
                    inst.name,
                    table.shape,
                    table_sharding,
                    table_bytes,
                    _indices_bytes(indices, table_sharding, result),
                    _bytes(inst, result),
                )
            )
    return found


def _indices_bytes(indices: Instruction, table_sharding: HloSharding | None, result: PropagationResult) -> int:
    """The indices each device gathers with. A table split along its rows only (each device holds a slice of
    every row) is gathered for every index on every device: the partitioner replicates the indices (MaxText's
    Llama 3 8B on v6e-8: s32[16384], all 8 x 2,048 tokens)."""
    if (
        table_sharding is not None
        and table_sharding.kind is Kind.TILED
        and table_sharding.data_tile_dims[0] == 1
        and isinstance(indices.shape, ArrayShape)
    ):
        return indices.shape.byte_size
    return _bytes(indices, result)


def _bytes(inst: Instruction, result: PropagationResult) -> int:
    return per_device_bytes(inst.shape, sharding_of(result, inst.name)) if isinstance(inst.shape, ArrayShape) else 0

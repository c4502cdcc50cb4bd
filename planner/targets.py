"""The compilers a step is predicted for: which pipeline prepares the module, and what lands in memory.

Each target names its compiler (`cpu`, `tpu`, `gpu`): `planner.prepare` runs that compiler's
pre-partitioning pipeline before propagation, so the module propagated is the one that compiler's
partitioner sees. Propagation's rules and the buffers are then the same everywhere; the target
decides what lands in memory:
- XLA:CPU up to the one jax 0.7.1 carries has no bf16/f16 arithmetic: float normalization computes
  that work in f32, so a bf16 temporary is held at f32 size (a value stored into a parameter, output
  or loop-carried buffer is converted back first). Today's XLA:CPU (jax 0.12's) keeps bf16 work in
  bf16 (its `CpuFloatSupport` lets its dot and elementwise emitters take bf16): measured on the CI
  subset's six bf16 steps, widening put the model 26-66% over its bytes and 4-22% under without.
  `cpu` is the XLA:CPU of the installed jaxlib (the one `--verify` compiles with); releases between
  0.7.1 and 0.12 are not measured and are read as 0.7.1's; a machine with no jaxlib gets today's.
- XLA:TPU computes a default-precision f32 dot on bf16 operands. A saved value that the backward
  pass reads only as a dot operand is converted before it is stored: the stacked residual is bf16.
- XLA:TPU's memory-space assignment keeps temporaries in on-chip memory (VMEM) when they fit; those
  bytes are not HBM. The bytes are what its assignment used in our references' buffer-assignment
  dumps: v6e 96 MiB and v5e 112 MiB of VMEM, v4 64 MiB of CMEM per device; on v5p it used 27 MiB
  where more was free, so its 32 MiB is a lower bound.
- XLA:TPU lends an output's allocation to its memory-space assignment until the output is written:
  its buffer assignment places prefetch copies (`copy-start`) of weights in the allocation of a
  gradient that is all-reduced at the end of the step. Returning that gradient smaller gives those
  bytes back to the heap, which the model does not size; measured on four language-model steps,
  pinning a returned embedding or head gradient saved XLA:TPU -134%, -70%, 4% and 52% of the
  output bytes it predicts (XLA:CPU: 100%, 100%, 147%). So XLA:TPU `lends_unwritten_outputs`: a plan
  for it claims no saving from returning a gradient smaller.
- XLA:TPU's partitioner computes an FSDP dot whose operand all-gather or result reduce-scatter spans 8 to 32
  devices as a windowed einsum once the dot has enough FLOPs per byte communicated (libtpu's cost model,
  measured per chip and group size: `WINDOWED_EINSUM_FLOPS_PER_BYTE`): the loop holds a few shards where
  the partitioner would otherwise gather the whole operand or write the whole partial sum
  (`planner.memory.windowed_einsum`). On MaxText's Llama 3 8B step (v6e-8) that is 16 of its 18 loops,
  and the LM head's gradient no longer holds two replicated 1,002 MiB buffers.
- XLA:TPU's and XLA:GPU's fusion computes cheap ops, f32 exponentials among them, again in every
  consumer (`planner.memory.buffers.materialises`): a softmax's f32 `[batch, seq, vocab]` intermediates
  hold no buffer, only the bf16 logits and their gradient do.
- v6e and v5p chips run gathers of embedding rows on their SparseCores; from libtpu 0.0.52 XLA:TPU holds
  three copies of each such gather's table beside its heap for the whole step (`planner.memory.sparse_core`,
  `sparse_core_table_copies`). A step prepared as an older libtpu has none (`release_backend`).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

MIB = 1 << 20


def _xla_cpu_widens_half_floats() -> bool:
    """Whether the installed jaxlib's XLA:CPU computes bf16/f16 work in f32 (jaxlib before 0.12)."""
    try:
        release = tuple(int(p) for p in version("jaxlib").split(".")[:2] if p.isdigit())
    except PackageNotFoundError:
        return False
    return release < (0, 12)


@dataclass(frozen=True, slots=True)
class Backend:
    name: str
    compiler: str  # "cpu" | "tpu" | "gpu"
    widens_half_floats: bool = False
    narrows_f32_dot_operands: bool = False
    alternate_memory_bytes: int = 0
    lends_unwritten_outputs: bool = False
    # The compiler runs each computation breadth-first (XLA:CPU's concurrency-optimized scheduler,
    # `planner.memory.schedule.bfs_schedule`), not in the order it was written; XLA:TPU's and XLA:GPU's
    # latency-hiding schedulers keep close to the written order, which the model walks as it is.
    schedules_breadth_first: bool = False
    # The buffer assignment places temporaries in the outputs' and donated parameters' allocations where
    # their live ranges leave room (`planner.memory.live_out_reuse`), before it packs the rest in its heap.
    temporaries_in_live_out_allocations: bool = False
    # Per group size, the FLOPs per byte of collective at which the partitioner makes a dot a windowed
    # einsum (`planner.memory.windowed_einsum`); empty: it never does.
    windowed_einsum_flops_per_byte: tuple[tuple[int, int], ...] = ()
    # The compiler's buffer assignment lets an all-reduce write its result over its operand (XLA:TPU's
    # does: a weight gradient's partial sums and their all-reduce share one allocation, offset and all);
    # XLA:CPU's gives the result a buffer of its own.
    all_reduces_in_place: bool = False
    # How many copies of the table each gather the chip's SparseCores run holds outside the heap for the whole
    # step (`planner.memory.sparse_core`): 3 from libtpu 0.0.52 on chips with SparseCores, else none.
    sparse_core_table_copies: int = 0
    # The smallest table (bytes per device) whose row gathers run on the SparseCores: smaller ones stay on the
    # TensorCore.
    sparse_core_min_table_bytes: int = 0

    @property
    def windowed_einsum_thresholds(self) -> dict[int, int]:
        return dict(self.windowed_einsum_flops_per_byte)


# Where libtpu's cost model starts making an FSDP dot a windowed einsum: per chip and number of devices
# in the loop, the dot's FLOPs per byte of its collective (bf16 tokens per device; f32 needs twice the
# tokens for the same ratio). Measured with libtpu 0.0.20 and 0.0.50 alike, to within 3%, by compiling
# FSDP all-gather and reduce-scatter dots for each topology ahead of time (`v6e:2x4`, `v6e:4x4`,
# `v6e:4x8`, `v5e:2x4`, `v5e:4x4`, `v5e:4x8`, `v5p:2x2x2`, `v5p:2x2x4`, `v5p:2x4x4`, `v4:2x2x1`,
# `v4:2x2x2`, `v4:2x2x4`; a group inside a larger mesh beside tensor parallelism, 8 of `v6e:4x4` or
# 32 of `v6e:8x8` and `v6e:16x16`, has the same threshold as the group alone). Groups of 2
# and 4 devices are never windowed, nor any of more than 32 (XLA's iteration limit).
WINDOWED_EINSUM_FLOPS_PER_BYTE: dict[str, tuple[tuple[int, int], ...]] = {
    "v6e": ((8, 1215), (16, 615), (32, 307)),
    "v5e": ((8, 535), (16, 267), (32, 131)),
    "v5p": ((8, 535), (16, 267), (32, 131)),
    "v4": ((8, 1151), (16, 195), (32, 96)),
}


# A libtpu release as pip names it (`0.0.52`, `0.0.50.1`): what `--libtpu` and the service's `libtpu` take.
LIBTPU_RELEASE = r"\d+(\.\d+){2,3}"


# Chips whose SparseCores libtpu offloads gathers of table rows to: how many thread-local copies of the table
# today's libtpu holds per gather, and the smallest table (bytes per device) it offloads (`planner.memory.
# sparse_core`, bracketed on MaxText's steps: v6e leaves tables of 31.3 MiB and offloads 62.6; v5p leaves Llama 2
# 70B's 7.8 MiB on v5p-128 and offloads Mixtral's 16 MiB; each floor is a round number inside its bracket). v5e
# has no SparseCore; v4's are not measured.
SPARSE_CORES: dict[str, tuple[int, int]] = {"v6e": (3, 32 * MIB), "v5p": (3, 8 * MIB)}


def _tpu(chip: str, alternate_memory_mib: int) -> Backend:
    """XLA:TPU for one chip: its on-chip memory and its windowed-einsum thresholds."""
    table_copies, min_table_bytes = SPARSE_CORES.get(chip, (0, 0))
    return Backend(
        chip,
        "tpu",
        narrows_f32_dot_operands=True,
        alternate_memory_bytes=alternate_memory_mib * MIB,
        lends_unwritten_outputs=True,
        windowed_einsum_flops_per_byte=WINDOWED_EINSUM_FLOPS_PER_BYTE[chip],
        all_reduces_in_place=True,
        sparse_core_table_copies=table_copies,
        sparse_core_min_table_bytes=min_table_bytes,
    )


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(
            "cpu",
            "cpu",
            widens_half_floats=_xla_cpu_widens_half_floats(),
            schedules_breadth_first=True,
            temporaries_in_live_out_allocations=True,
        ),
        Backend("tpu", "tpu", narrows_f32_dot_operands=True, lends_unwritten_outputs=True, all_reduces_in_place=True),
        _tpu("v6e", 96),
        _tpu("v5e", 112),
        _tpu("v5p", 32),
        _tpu("v4", 64),
        Backend("gpu", "gpu"),
        Backend("h100", "gpu"),
        Backend("h200", "gpu"),
    )
}


def backend(name: str | Backend) -> Backend:
    if isinstance(name, Backend):
        return name
    try:
        return BACKENDS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}") from None


def tpu_topology(chip_name: str, num_devices: int) -> str | None:
    """A topology libtpu describes for `num_devices` devices of this chip, or None.

    v6e and v5e slices are 2D (8 devices: `v6e:2x4`, 256: `v6e:16x16`), v5p and v4 slices 3D; a v4
    chip holds two devices (`v4:2x2x1` is 8 devices). Past 16x16, libtpu 0.0.20 still describes
    near-square 2D slices (`v6e:16x32` for 512, `v6e:32x32`, `v6e:32x64`): a physical v6e slice stops
    at 256 chips, so that is a multislice job compiled as if it were one slice.
    """
    name = chip_name.lower()
    if name in ("v6e", "v5e"):
        a = int(num_devices**0.5)
        while a > 1 and num_devices % a:
            a -= 1
        b = num_devices // a
        return f"{name}:{a}x{b}" if a * b == num_devices and (b <= 16 or b <= 2 * a) else None
    if name in ("v5p", "v4"):
        chips, rest = divmod(num_devices, 2 if name == "v4" else 1)
        triples = [
            (x, y, chips // (x * y))
            for x in range(1, chips + 1)
            for y in range(1, chips + 1)
            if not rest and chips % (x * y) == 0 and x >= y >= chips // (x * y)
        ]
        if not triples:
            return None
        x, y, z = min(triples, key=lambda t: t[0] / t[2])
        return f"{name}:{x}x{y}x{z}"
    return None

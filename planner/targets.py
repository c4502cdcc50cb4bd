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
    # The compiler orders each computation for the least memory (XLA:CPU's memory scheduler), not for
    # latency (XLA:TPU's and XLA:GPU's latency-hiding schedulers): the model measures that order too.
    schedules_for_memory: bool = False


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("cpu", "cpu", widens_half_floats=_xla_cpu_widens_half_floats(), schedules_for_memory=True),
        Backend("tpu", "tpu", narrows_f32_dot_operands=True, lends_unwritten_outputs=True),
        Backend(
            "v6e", "tpu", narrows_f32_dot_operands=True, alternate_memory_bytes=96 * MIB, lends_unwritten_outputs=True
        ),
        Backend(
            "v5e", "tpu", narrows_f32_dot_operands=True, alternate_memory_bytes=112 * MIB, lends_unwritten_outputs=True
        ),
        Backend(
            "v5p", "tpu", narrows_f32_dot_operands=True, alternate_memory_bytes=32 * MIB, lends_unwritten_outputs=True
        ),
        Backend(
            "v4", "tpu", narrows_f32_dot_operands=True, alternate_memory_bytes=64 * MIB, lends_unwritten_outputs=True
        ),
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

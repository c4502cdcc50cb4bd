"""The reference cases: which model, front end, partitioner and remat each fixture is made with.

A case is a frozen value checked on construction; `CASES` is the table the CLI walks. The grid
sweep will generate this table instead of listing it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

FRONT_ENDS = ("jax", "torch_xla")
PARTITIONERS = ("gspmd", "shardy")
# "checkpoint": jax.checkpoint around the scanned layer (nothing saved, everything recomputed).
# "min_cut": AOTAutograd's min-cut partitioner decides what the backward recomputes.
REMAT_POLICIES = (None, "checkpoint", "min_cut")


@dataclass(frozen=True)
class LlamaSize:
    """A Llama decoder stack's sizes; every layer is the same, so the params stack to [num_layers, ...]."""

    num_layers: int
    hidden_size: int = 1024
    ffn_size: int = 4096
    num_heads: int = 8
    num_kv_heads: int = 8
    head_size: int = 128
    batch_size: int = 8
    seq_len: int = 64
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.num_heads * self.head_size != self.hidden_size:
            raise ValueError(
                f"num_heads={self.num_heads} x head_size={self.head_size} must equal hidden_size={self.hidden_size}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_size % 2:
            raise ValueError(f"head_size={self.head_size} must be even for RoPE")


@dataclass(frozen=True)
class MeshSpec:
    shape: tuple[int, ...] = (4, 2)
    axis_names: tuple[str, ...] = ("fsdp", "tp")

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.axis_names):
            raise ValueError(f"mesh shape={self.shape} does not match axis_names={self.axis_names}")

    @property
    def num_devices(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Case:
    name: str
    front_end: str
    partitioner: str
    remat: str | None
    size: LlamaSize
    mesh: MeshSpec = field(default_factory=MeshSpec)

    def __post_init__(self) -> None:
        if self.front_end not in FRONT_ENDS:
            raise ValueError(f"front_end={self.front_end!r} is not one of {FRONT_ENDS}")
        if self.partitioner not in PARTITIONERS:
            raise ValueError(f"partitioner={self.partitioner!r} is not one of {PARTITIONERS}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat={self.remat!r} is not one of {REMAT_POLICIES}")
        # torch_xla 2.9 only partitions with GSPMD.
        if self.front_end == "torch_xla" and self.partitioner != "gspmd":
            raise ValueError(f"front_end='torch_xla' has no partitioner={self.partitioner!r}")

    def config(self) -> dict[str, object]:
        """The `config` record of NAME.xla.json, in the corpus's keys (D, F, H, ...) plus what this sweep varies."""
        s = self.size
        return {
            "kind": "llama",
            "D": s.hidden_size,
            "F": s.ffn_size,
            "H": s.num_heads,
            "KV": s.num_kv_heads,
            "head_dim": s.head_size,
            "L": s.num_layers,
            "B": s.batch_size,
            "S": s.seq_len,
            "mesh": list(self.mesh.shape),
            "axes": list(self.mesh.axis_names),
            "dtype": s.dtype,
            "pinned": False,
            "remat": self.remat is not None,
            "remat_policy": self.remat,
            "partitioner": self.partitioner,
            "front_end": self.front_end,
        }


LLAMA_405B = LlamaSize(
    num_layers=126,
    hidden_size=16384,
    ffn_size=53248,
    num_heads=128,
    num_kv_heads=8,
    head_size=128,
    batch_size=64,
    seq_len=2048,
    dtype="bfloat16",
)

CASES: tuple[Case, ...] = (
    Case("jax_llama_remat_L8_fsdp4_tp2", "jax", "gspmd", "checkpoint", LlamaSize(num_layers=8)),
    Case("jax_llama_shardy_L8_fsdp4_tp2", "jax", "shardy", None, LlamaSize(num_layers=8)),
    Case("jax_llama_shardy_remat_L8_fsdp4_tp2", "jax", "shardy", "checkpoint", LlamaSize(num_layers=8)),
    Case("torch_xla_llama_remat_L4_fsdp4_tp2", "torch_xla", "gspmd", "min_cut", LlamaSize(num_layers=4)),
    # Remat at scale: Llama 3.1 405B's shapes (GQA, bf16) on 256 devices, lowered from abstract inputs.
    *(
        Case(f"jax_llama405b_{name}_L126_fsdp64_tp4", "jax", partitioner, "checkpoint", LLAMA_405B, MeshSpec((64, 4)))
        for name, partitioner in (("remat", "gspmd"), ("shardy_remat", "shardy"))
    ),
)


def case_named(name: str) -> Case:
    for case in CASES:
        if case.name == name:
            return case
    raise ValueError(f"no case named {name!r}; known: {', '.join(c.name for c in CASES)}")

"""The reference cases: which model, step, front end, partitioner, remat, mesh and compilers each one is made with.

A case is a frozen value checked on construction. `CASES` is every case the sweep knows: the committed
fixtures (`FIXTURE_CASES`) and the seeded grid (`grid()`), which covers what users train with: four
model families, three remat modes, two dtypes, five 8-device meshes, 256-chip meshes, gradients free and
pinned, GSPMD and Shardy, several sizes; then the whole steps around the layer stack (`lm_grid()`):
language models with tied and untied embeddings and both cross-entropy spellings, a ViT, AdamW with
clipping and mixed precision, gradient accumulation, sequence parallelism, packed sequences, an
expert axis. `CI_CASES` is the fixed subset the tests regenerate.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

from planner.targets import tpu_topology

FRONT_ENDS = ("jax", "torch_xla")
PARTITIONERS = ("gspmd", "shardy")
FAMILIES = ("llama", "gpt2", "mlp", "moe")
DTYPES = ("float32", "bfloat16")
# "full": jax.checkpoint around the scanned layer (nothing saved, everything recomputed).
# "dots": jax.checkpoint with the dots-without-batch-dims policy (projections saved, the rest recomputed).
# "min_cut": AOTAutograd's min-cut partitioner decides what torch_xla's scan recomputes.
REMAT_POLICIES = (None, "full", "dots", "min_cut")
# torch_xla's ways of running the layer stack: scan_layers as shipped (gradients shard_as their
# weights), scan_layers with that shard_as disabled, and a plain Python loop over the layers.
TORCH_MODES = ("scan", "scan_no_shard_as", "loop")
# What the step computes around the layer stack.
# "toy": x [batch, seq, hidden] in, loss = mean(y**2); no embedding, head or optimizer (the first grid).
# "lm": int32 tokens [batch, seq + 1] in (sharded over the batch axes); token embedding gather, the
#   stack, a final norm, an LM head, cross-entropy in f32 against the tokens shifted by one.
# "lm_tied": "lm" whose head is the embedding's transpose (tied input and output embeddings).
# "vit": images in; a patch-embedding convolution, the stack without a causal mask, mean pooling and
#   a classifier head (vocab_size is the number of classes).
STEPS = ("toy", "lm", "lm_tied", "vit")
# How the loss reads the target's log-probability: log_softmax + take_along_axis (a gather, whose
# gradient is a scatter), or one_hot(targets) * log_softmax summed over the vocabulary (MaxText's).
CROSS_ENTROPIES = ("take_along_axis", "one_hot")
# AdamW inside the step (params and state donated, out_shardings = in_shardings), optionally after
# clipping the gradients to global norm 1 (clip_by_global_norm).
OPTIMIZERS = (None, "adamw", "adamw_clip")
# With bf16 params: "f32_state" keeps AdamW's m and v in f32 (the update is computed in f32 and
# rounded into the params); "f32_master" also keeps an f32 master copy of the params in the state,
# which the update applies to and the bf16 params are rounded from. None: the state is in the
# params' dtype.
MIXED_PRECISIONS = (None, "f32_state", "f32_master")
MESH_AXES = ("data", "fsdp", "tp", "expert")
# transformers' decoder models a torch_xla step can be instead of the example stack: the model class
# built from a small config of the package's (no weights downloaded), its decoder layers through the
# drop-in `scan_decoder_layers` (or its own loop), its own loss. Gemma ties its head to the embedding;
# Mixtral is the moe family (experts and top-k from the case's size); Qwen2's q/k/v projections carry
# biases; Phi-3 fuses q/k/v into one `qkv_proj` and gate/up into one `gate_up_proj`.
TRANSFORMERS_MODELS = ("llama", "mistral", "gemma", "mixtral", "qwen2", "phi3")


@dataclass(frozen=True)
class ModelSize:
    """A layer stack's sizes; every layer is the same, so the params stack to [num_layers, ...]."""

    num_layers: int
    hidden_size: int = 1024
    ffn_size: int = 4096
    num_heads: int = 8
    num_kv_heads: int = 8
    head_size: int = 128
    batch_size: int = 8
    seq_len: int = 64
    dtype: str = "float32"
    num_experts: int = 0  # the moe family's experts per layer
    top_k: int = 2
    vocab_size: int = 0  # a language model's vocabulary, a ViT's classes; 0 for the toy step

    def __post_init__(self) -> None:
        if self.num_heads * self.head_size != self.hidden_size:
            raise ValueError(
                f"num_heads={self.num_heads} x head_size={self.head_size} must equal hidden_size={self.hidden_size}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_size % 2:
            raise ValueError(f"head_size={self.head_size} must be even for RoPE")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is not one of {DTYPES}")
        if self.num_experts and not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"top_k={self.top_k} must be in 1..num_experts={self.num_experts}")
        if self.vocab_size < 0:
            raise ValueError(f"vocab_size={self.vocab_size} must not be negative")


@dataclass(frozen=True)
class MeshSpec:
    shape: tuple[int, ...] = (4, 2)
    axis_names: tuple[str, ...] = ("fsdp", "tp")

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.axis_names):
            raise ValueError(f"mesh shape={self.shape} does not match axis_names={self.axis_names}")
        if set(self.axis_names) - set(MESH_AXES) or "fsdp" not in self.axis_names:
            raise ValueError(f"axis_names={self.axis_names}: the models shard over fsdp and optionally {MESH_AXES}")
        if len(set(self.axis_names)) != len(self.axis_names):
            raise ValueError(f"axis_names={self.axis_names} names an axis twice")

    @property
    def num_devices(self) -> int:
        return math.prod(self.shape)

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """The axes the batch is split over: data parallel, fsdp and (outside the experts) expert all split it."""
        return tuple(a for a in ("data", "fsdp", "expert") if a in self.axis_names)

    def size(self, axis: str) -> int:
        return self.shape[self.axis_names.index(axis)] if axis in self.axis_names else 1

    def label(self) -> str:
        return "_".join(f"{a}{n}" for a, n in zip(self.axis_names, self.shape))


@dataclass(frozen=True)
class Case:
    name: str
    front_end: str
    partitioner: str
    remat: str | None
    size: ModelSize
    mesh: MeshSpec = field(default_factory=MeshSpec)
    family: str = "llama"
    pinned: bool = False  # gradients' out_shardings set to their parameters' shardings
    chip: str | None = "v6e"  # the TPU chip preset compiled for (JAX only); None: XLA:CPU only
    torch_mode: str = "scan"
    step: str = "toy"  # one of STEPS
    cross_entropy: str | None = None  # one of CROSS_ENTROPIES for every step but the toy one
    optimizer: str | None = None  # one of OPTIMIZERS
    mixed_precision: str | None = None  # one of MIXED_PRECISIONS
    microbatches: int = 1  # > 1: gradients accumulated in f32 over a lax.scan of this many microbatches
    seq_parallel: bool = False  # activations pinned [batch, seq over tp, hidden] after each residual add
    # Several documents per row: segment ids and positions come with the tokens; attention stays within
    # a document and the loss skips padding (segment 0) and the first token of each document.
    packed: bool = False
    z_loss: bool = False  # PaLM's 1e-4 * logsumexp(logits)**2 per token added to the loss
    transformers_model: str | None = None  # one of TRANSFORMERS_MODELS (torch_xla only): that model's own step

    def __post_init__(self) -> None:
        if self.front_end not in FRONT_ENDS:
            raise ValueError(f"front_end={self.front_end!r} is not one of {FRONT_ENDS}")
        if self.partitioner not in PARTITIONERS:
            raise ValueError(f"partitioner={self.partitioner!r} is not one of {PARTITIONERS}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat={self.remat!r} is not one of {REMAT_POLICIES}")
        if self.family not in FAMILIES:
            raise ValueError(f"family={self.family!r} is not one of {FAMILIES}")
        if self.torch_mode not in TORCH_MODES:
            raise ValueError(f"torch_mode={self.torch_mode!r} is not one of {TORCH_MODES}")
        if (self.family == "moe") != bool(self.size.num_experts):
            raise ValueError(f"family={self.family!r} with num_experts={self.size.num_experts}")
        if self.front_end == "torch_xla":
            # torch_xla 2.9 only partitions with GSPMD; XLA:TPU compiles its dump ahead of time through
            # the faithful StableHLO conversion (planner.plan.compilers.stablehlo).
            family = "moe" if self.transformers_model == "mixtral" else "llama"
            if self.partitioner != "gspmd" or self.family != family:
                raise ValueError(f"{self.name}: torch_xla cases are GSPMD llama steps, or transformers' Mixtral")
            if self.remat not in (None, "min_cut"):
                raise ValueError(f"{self.name}: torch_xla's remat is the min_cut partition_fn")
            # F.cross_entropy is log_softmax + nll_loss: the take_along_axis spelling.
            if self.step not in ("toy", "lm", "lm_tied") or self.cross_entropy == "one_hot":
                raise ValueError(f"{self.name}: torch_xla steps are the toy one or an LM with F.cross_entropy")
            if self.optimizer not in (None, "adamw") or self.microbatches != 1 or self.seq_parallel or self.packed:
                raise ValueError(f"{self.name}: torch_xla steps take torch.optim.AdamW and nothing else")
        elif self.remat == "min_cut":
            raise ValueError(f"{self.name}: min_cut is torch_xla's remat; JAX's are full and dots")
        if self.size.batch_size % math.prod(map(self.mesh.size, self.mesh.batch_axes)):
            raise ValueError(f"{self.name}: batch_size={self.size.batch_size} does not split over {self.mesh}")
        if "expert" in self.mesh.axis_names and (
            self.family != "moe" or self.size.num_experts % self.mesh.size("expert")
        ):
            raise ValueError(
                f"{self.name}: an expert axis of {self.mesh.size('expert')} splits the moe family's experts, "
                f"not family={self.family!r} with num_experts={self.size.num_experts}"
            )
        self._check_step()
        self._check_transformers_model()
        if self.chip is not None and self.tpu_topology is None:
            raise ValueError(f"{self.name}: no libtpu topology for {self.chip} with {self.mesh.num_devices} devices")

    def _check_step(self) -> None:
        for value, allowed in ((self.step, STEPS), (self.cross_entropy, (None, *CROSS_ENTROPIES)),
                               (self.optimizer, OPTIMIZERS), (self.mixed_precision, MIXED_PRECISIONS)):  # fmt: skip
            if value not in allowed:
                raise ValueError(f"{self.name}: {value!r} is not one of {allowed}")
        s = self.size
        if self.step == "toy":
            # The toy step's one option is accumulation: its loss needs no batch of tokens.
            if self.step_config() | {"microbatches": 1} != _TOY_STEP_CONFIG:
                raise ValueError(
                    f"{self.name}: the toy step has no loss, batch or optimizer options: {self.step_config()}"
                )
            self._check_microbatches()
            return
        if self.cross_entropy is None or s.vocab_size == 0:
            raise ValueError(f"{self.name}: step={self.step!r} needs a cross_entropy and size.vocab_size")
        if self.step == "vit":
            if self.family != "gpt2" or math.isqrt(s.seq_len) ** 2 != s.seq_len or self.packed or self.z_loss:
                raise ValueError(
                    f"{self.name}: the ViT is the gpt2 family over a square grid of patches (seq_len={s.seq_len}), "
                    "whole images: no packing, no z-loss"
                )
        elif self.family == "mlp":
            raise ValueError(f"{self.name}: the mlp family has no attention; its steps are toy ones")
        elif s.vocab_size % self.mesh.size("tp"):
            raise ValueError(f"{self.name}: vocab_size={s.vocab_size} does not split over tp={self.mesh.size('tp')}")
        if self.mixed_precision is not None and (self.optimizer is None or s.dtype != "bfloat16"):
            raise ValueError(
                f"{self.name}: mixed_precision={self.mixed_precision!r} is for an optimizer over bf16 params"
            )
        if self.optimizer is not None and self.front_end == "jax" and not self.pinned:
            raise ValueError(f"{self.name}: an optimizer step returns params and state pinned to their in_shardings")
        self._check_microbatches()
        if self.seq_parallel and (self.mesh.size("tp") == 1 or s.seq_len % self.mesh.size("tp")):
            raise ValueError(f"{self.name}: sequence parallelism splits seq_len={s.seq_len} over a tp axis")

    def _check_transformers_model(self) -> None:
        model = self.transformers_model
        if model is None:
            return
        if model not in TRANSFORMERS_MODELS:
            raise ValueError(f"{self.name}: transformers_model={model!r} is not one of {TRANSFORMERS_MODELS}")
        tied = "lm_tied" if model == "gemma" else "lm"
        if self.front_end != "torch_xla" or self.step != tied or self.torch_mode == "scan_no_shard_as":
            raise ValueError(
                f"{self.name}: transformers' {model} is a torch_xla {tied} step through scan or its own loop"
            )
        if set(self.mesh.axis_names) != {"fsdp", "tp"}:
            raise ValueError(f"{self.name}: transformers' models are sharded FSDPv2-style over fsdp and tp")

    def _check_microbatches(self) -> None:
        per_step = self.microbatches * math.prod(map(self.mesh.size, self.mesh.batch_axes))
        if self.microbatches < 1 or self.size.batch_size % per_step:
            raise ValueError(
                f"{self.name}: batch_size={self.size.batch_size} does not split into {self.microbatches} "
                f"microbatches over {self.mesh}"
            )

    def step_config(self) -> dict[str, object]:
        """What the step computes around the layer stack (`config()` records it for every step but the toy one)."""
        return {
            "step": self.step,
            "V": self.size.vocab_size,
            "cross_entropy": self.cross_entropy,
            "optimizer": self.optimizer,
            "mixed_precision": self.mixed_precision,
            "microbatches": self.microbatches,
            "seq_parallel": self.seq_parallel,
            "packed": self.packed,
            "z_loss": self.z_loss,
        }

    @property
    def tpu_topology(self) -> str | None:
        return None if self.chip is None else tpu_topology(self.chip, self.mesh.num_devices)

    def config(self) -> dict[str, object]:
        """The `config` record of NAME.xla.json, in the corpus's keys (D, F, H, ...) plus what this sweep varies."""
        s = self.size
        record: dict[str, object] = {
            "kind": self.family,
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
            "pinned": self.pinned,
            "remat": self.remat is not None,
            "remat_policy": self.remat,
            "partitioner": self.partitioner,
            "front_end": self.front_end,
            "tpu_topology": self.tpu_topology,
        }
        if s.num_experts:
            record |= {"E": s.num_experts, "top_k": s.top_k}
        if self.front_end == "torch_xla":
            record["torch_mode"] = self.torch_mode
        if self.transformers_model is not None:
            record["transformers_model"] = self.transformers_model
        if self.step != "toy":
            record |= self.step_config()
        elif self.microbatches > 1:
            record["microbatches"] = self.microbatches
        return record


_TOY_STEP_CONFIG: dict[str, object] = {"step": "toy", "V": 0, "cross_entropy": None, "optimizer": None,
                                       "mixed_precision": None, "microbatches": 1, "seq_parallel": False,
                                       "packed": False, "z_loss": False}  # fmt: skip


LLAMA_405B = ModelSize(
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
# Llama 3.1 8B's layer (GQA 32/8, FF 14336) at a short sequence: a 256-chip step that compiles in seconds.
LLAMA_8B = ModelSize(
    num_layers=8,
    hidden_size=4096,
    ffn_size=14336,
    num_heads=32,
    num_kv_heads=8,
    head_size=128,
    batch_size=256,
    seq_len=256,
    dtype="bfloat16",
)

# GPT-2 XL's width at 12 layers, a long sequence and a large global batch.
GPT2_XL_WIDE = ModelSize(12, 1536, 6144, 16, 16, 96, 256, 512, "bfloat16")

FIXTURE_CASES: tuple[Case, ...] = (
    Case("jax_llama_remat_L8_fsdp4_tp2", "jax", "gspmd", "full", ModelSize(num_layers=8)),
    Case("jax_llama_shardy_L8_fsdp4_tp2", "jax", "shardy", None, ModelSize(num_layers=8)),
    Case("jax_llama_shardy_remat_L8_fsdp4_tp2", "jax", "shardy", "full", ModelSize(num_layers=8)),
    Case("torch_xla_llama_remat_L4_fsdp4_tp2", "torch_xla", "gspmd", "min_cut", ModelSize(num_layers=4), chip=None),
    # Remat at scale: Llama 3.1 405B's shapes (GQA, bf16) on 256 devices, lowered from abstract inputs.
    *(
        Case(f"jax_llama405b_{name}_L126_fsdp64_tp4", "jax", partitioner, "full", LLAMA_405B, MeshSpec((64, 4)))
        for name, partitioner in (("remat", "gspmd"), ("shardy_remat", "shardy"))
    ),
)

# A 405B-shaped step that does not fit a v6e even after the plan pins its gradients (no remat: the
# saved activations alone are twice the chip), and the options beyond sharding, each compiled.
# XLA:TPU refuses to compile a step whose temporaries exceed the chip's HBM, so the steps that do not
# fit a v6e are compiled for v5p (95 GiB), the same compiler on a larger chip; remat with pinned
# gradients fits and is compiled for v6e. Sequence 1024: at 2048 the temporaries exceed a v5p too.
# JAX lowers a batch only when it splits evenly, so the 512-chip step keeps one sample per chip
# (batch 128); with one sample per chip on fsdp=64 (batch 64) half the batch cannot split, so the
# half-batch option starts from a batch-128 step (two per chip), whose half is the batch-64 step.
LLAMA_405B_S1024 = replace(LLAMA_405B, seq_len=1024)
LLAMA_405B_B128_S1024 = replace(LLAMA_405B_S1024, batch_size=128)
NEXT_STEP_CASES: tuple[Case, ...] = tuple(
    Case(f"jax_llama405b_{name}_L126_fsdp{n}_tp4", "jax", "gspmd", remat, size, MeshSpec((n, 4)), "llama", pinned, chip)
    for name, remat, size, n, pinned, chip in (
        ("noremat_free_S1024", None, LLAMA_405B_S1024, 64, False, "v5p"),
        ("noremat_pinned_S1024", None, LLAMA_405B_S1024, 64, True, "v5p"),
        ("remat_pinned_S1024", "full", LLAMA_405B_S1024, 64, True, "v6e"),
        ("noremat_pinned_B128_S1024", None, LLAMA_405B_B128_S1024, 128, True, "v5p"),
        # Starting points whose modules alone are needed (XLA:CPU compiles them for the header): the
        # half-batch option's, and the same step at sequence 2048, whose remat is the grid's
        # jax_llama_full_bf16_gspmd_fsdp64_tp4_L126_D16384_pinned.
        ("noremat_pinned_B128_S1024", None, LLAMA_405B_B128_S1024, 64, True, None),
        ("noremat_pinned", None, LLAMA_405B, 64, True, None),
    )
)

GRID_MESHES = (
    MeshSpec((1, 8)),
    MeshSpec((2, 4)),
    MeshSpec((4, 2)),
    MeshSpec((8, 1)),
    MeshSpec((2, 2, 2), ("data", "fsdp", "tp")),
)
GRID_CHIPS = ("v6e", "v6e", "v5p", "v5e", "v4")


def _family_size(family: str, rng: random.Random, num_layers: int, dtype: str) -> ModelSize:
    """A step of the family's shape, hundreds of MiB to a few GiB per chip.

    XLA:TPU's compile time grows with the shapes (a 405B-shaped step takes about a minute), so the
    grid stays at the low end of what users train; the 256-chip cases cover the large end.
    """
    batch, seq = rng.choice((8, 16)), rng.choice((256, 512))
    if family == "llama":
        hidden = rng.choice((1024, 2048))
        heads = hidden // 128
        return ModelSize(num_layers, hidden, rng.choice((2816, 4096)) * hidden // 1024, heads,
                         rng.choice((8, heads)), 128, batch, seq, dtype)  # fmt: skip
    if family == "gpt2":
        hidden = rng.choice((768, 1024))
        return ModelSize(num_layers, hidden, 4 * hidden, 8, 8, hidden // 8, batch, seq, dtype)
    if family == "mlp":
        hidden = rng.choice((2048, 4096))
        return ModelSize(num_layers, hidden, rng.choice((2, 4)) * hidden, 8, 8, hidden // 8, batch, seq, dtype)
    hidden = 1024
    return ModelSize(num_layers, hidden, rng.choice((1024, 2048)), 8, 8, 128, batch, seq, dtype,
                     num_experts=rng.choice((4, 8)), top_k=2)  # fmt: skip


def _name(front_end: str, family: str, remat: str | None, size: ModelSize, partitioner: str, mesh: MeshSpec,
          pinned: bool, extra: str = "") -> str:  # fmt: skip
    dtype = {"float32": "f32", "bfloat16": "bf16"}[size.dtype]
    parts = [front_end, family + extra, remat or "noremat", dtype, partitioner, mesh.label(), f"L{size.num_layers}",
             f"D{size.hidden_size}", "pinned" if pinned else "free"]  # fmt: skip
    return "_".join(parts)


def grid(seed: int = 13) -> tuple[Case, ...]:
    """The seeded sweep: every family x JAX remat x dtype x partitioner, twice, on rotating meshes and chips.

    The rotation (not the seed) guarantees each mesh, chip and gradient mode appears for every family;
    the seed picks sizes. Then 256-chip steps and torch_xla's modes, then the whole steps of `lm_grid`.
    """
    rng = random.Random(seed)
    cases: list[Case] = []
    k = 0
    for family in FAMILIES:
        for remat in (None, "full", "dots"):
            for dtype in DTYPES:
                for partitioner in PARTITIONERS:
                    for _ in range(2):
                        mesh = GRID_MESHES[k % len(GRID_MESHES)]
                        pinned = (k // len(GRID_MESHES)) % 2 == 1
                        chip = GRID_CHIPS[(k // 2) % len(GRID_CHIPS)]
                        size = _family_size(family, rng, rng.choice((4, 8, 16)), dtype)
                        name = _name("jax", family, remat, size, partitioner, mesh, pinned)
                        cases.append(Case(name, "jax", partitioner, remat, size, mesh, family, pinned, chip))
                        k += 1
    big = (
        ("llama", LLAMA_8B, None, "gspmd", MeshSpec((16, 16)), False, "v6e"),
        ("llama", LLAMA_8B, "dots", "shardy", MeshSpec((16, 16)), True, "v6e"),
        ("llama", LLAMA_8B, "full", "gspmd", MeshSpec((64, 4)), False, "v5e"),
        ("llama", LLAMA_405B, "full", "gspmd", MeshSpec((64, 4)), True, "v6e"),
        ("llama", LLAMA_405B, "full", "shardy", MeshSpec((64, 4)), True, "v6e"),
        ("gpt2", GPT2_XL_WIDE, "dots", "gspmd", MeshSpec((32, 8)), False, "v6e"),
    )
    for family, size, remat, partitioner, mesh, pinned, chip in big:
        name = _name("jax", family, remat, size, partitioner, mesh, pinned)
        cases.append(Case(name, "jax", partitioner, remat, size, mesh, family, pinned, chip))
    # torch_xla runs the step on the CPU devices (it has no abstract inputs): sized to run in seconds.
    torch_size = ModelSize(num_layers=4, hidden_size=1024, ffn_size=4096, num_heads=8, head_size=128, seq_len=256)
    for mode in TORCH_MODES:
        for remat in (None, "min_cut"):
            if mode == "loop" and remat is not None:
                continue  # remat is a property of scan's partition_fn
            for mesh in (MeshSpec((4, 2)), MeshSpec((2, 4))):
                name = _name("torch_xla", "llama", remat, torch_size, "gspmd", mesh, False, f"_{mode}")
                cases.append(Case(name, "torch_xla", "gspmd", remat, torch_size, mesh, chip="v6e", torch_mode=mode))
    return tuple(cases) + lm_grid(seed)


def step_label(case: Case) -> str:
    """The step's part of a case name: `lm_onehot_V32768_adamwclip_f32master_accum4_sp_packed_zloss`."""
    parts = [case.step.replace("_", ""), {"take_along_axis": "take", "one_hot": "onehot"}[case.cross_entropy or ""]]
    parts.append(f"C{case.size.vocab_size}" if case.step == "vit" else f"V{case.size.vocab_size}")
    parts += [x.replace("_", "") for x in (case.optimizer, case.mixed_precision) if x]
    parts += [f"accum{case.microbatches}"] * (case.microbatches > 1)
    parts += [flag for flag, on in (("sp", case.seq_parallel), ("packed", case.packed), ("zloss", case.z_loss)) if on]
    return "_".join(parts)


def named(case: Case, prefix: str = "") -> Case:
    """The case under its readable name: the grid's parts with the step's label after the family."""
    model = f"_hf{case.transformers_model}" if case.transformers_model else ""
    extra = model + (f"_{case.torch_mode}" if case.front_end == "torch_xla" else "") + "_" + step_label(case)
    return replace(case, name=prefix + _name(case.front_end, case.family, case.remat, case.size, case.partitioner,
                                             case.mesh, case.pinned, extra))  # fmt: skip


LM_MESHES = {
    "4x2": MeshSpec((4, 2)),
    "2x4": MeshSpec((2, 4)),
    "1x8": MeshSpec((1, 8)),
    "8x1": MeshSpec((8, 1)),
    "3d": MeshSpec((2, 2, 2), ("data", "fsdp", "tp")),
    "e2f2t2": MeshSpec((2, 2, 2), ("expert", "fsdp", "tp")),
    "e4f2": MeshSpec((4, 2), ("expert", "fsdp")),
    "e2f4": MeshSpec((2, 4), ("expert", "fsdp")),
}
# Llama 3's vocabulary on the 256-chip steps.
LLAMA3_VOCAB = 128256


def _step_size(family: str, step: str, rng: random.Random, dtype: str, min_batch: int) -> ModelSize:
    if step == "vit":
        # ViT-B/16 at 224 pixels (14 x 14 patches), ImageNet's classes.
        return ModelSize(rng.choice((4, 8)), 768, 3072, 12, 12, 64, 16, 196, dtype, vocab_size=1000)
    size = _family_size(family, rng, rng.choice((4, 8)), dtype)
    batch = max(size.batch_size, min_batch)
    return replace(size, batch_size=batch, vocab_size=rng.choice((8192, 16384, 32000, 32768)))


def lm_grid(seed: int = 13) -> tuple[Case, ...]:
    """Whole training steps: each row one realistic combination, sizes seeded (a stream of its own, so
    the first grid's sizes stay what they were).

    Together: LM steps tied and untied with both cross-entropy spellings, a ViT, AdamW with and without
    clipping, bf16 params with f32 state or an f32 master copy, accumulation over 2 and 4 microbatches,
    sequence parallelism, packed sequences with z-loss, an expert axis of 2 and 4; GSPMD and Shardy,
    six meshes, four chips; two 256-chip LM steps with Llama 3's vocabulary; torch_xla's LM steps.
    """
    rng = random.Random(seed + 1)
    table = (
        # family, step, cross-entropy, optimizer, mixed precision, microbatches, options (sequence
        # parallel, packed, z-loss; pinned gradients, which every optimizer step has), remat, dtype,
        # partitioner, mesh, chip
        ("llama", "lm", "take", None, None, 1, "", None, "f32", "gspmd", "4x2", "v6e"),
        ("llama", "lm", "onehot", None, None, 1, "", "full", "bf16", "shardy", "2x4", "v5e"),
        ("llama", "lm", "take", None, None, 1, "pinned", "dots", "bf16", "gspmd", "1x8", "v6e"),
        ("llama", "lm_tied", "take", None, None, 1, "", None, "f32", "gspmd", "8x1", "v5p"),
        ("llama", "lm_tied", "onehot", "adamw", None, 1, "", None, "f32", "gspmd", "4x2", "v6e"),
        ("llama", "lm_tied", "take", "adamw_clip", "f32_master", 1, "", "full", "bf16", "shardy", "4x2", "v6e"),
        ("llama", "lm", "onehot", "adamw_clip", "f32_state", 1, "", "dots", "bf16", "gspmd", "3d", "v4"),
        ("llama", "lm", "take", "adamw", "f32_master", 1, "", None, "bf16", "shardy", "2x4", "v5p"),
        ("llama", "lm", "take", None, None, 4, "", None, "f32", "gspmd", "4x2", "v6e"),
        ("llama", "lm", "onehot", "adamw_clip", "f32_master", 2, "", "full", "bf16", "gspmd", "2x4", "v6e"),
        ("llama", "lm_tied", "onehot", "adamw", None, 4, "", "dots", "f32", "shardy", "3d", "v5e"),
        ("llama", "lm", "take", None, None, 1, "sp", "full", "bf16", "gspmd", "4x2", "v6e"),
        ("llama", "lm", "onehot", "adamw_clip", "f32_state", 1, "sp", None, "bf16", "shardy", "2x4", "v6e"),
        ("llama", "lm_tied", "take", "adamw", None, 2, "sp", "full", "f32", "gspmd", "1x8", "v5p"),
        ("llama", "lm", "take", None, None, 1, "packed zloss", None, "bf16", "gspmd", "4x2", "v6e"),
        ("llama", "lm", "onehot", "adamw_clip", "f32_master", 1, "packed zloss", "full", "bf16", "shardy", "8x1", "v4"),
        ("moe", "lm", "take", None, None, 1, "", None, "bf16", "gspmd", "e2f2t2", "v6e"),
        ("moe", "lm", "onehot", "adamw_clip", "f32_master", 1, "", "full", "bf16", "shardy", "e4f2", "v5p"),
        ("moe", "lm_tied", "take", "adamw", None, 2, "", None, "f32", "gspmd", "e2f4", "v6e"),
        ("gpt2", "lm_tied", "take", None, None, 1, "", "dots", "f32", "gspmd", "2x4", "v5e"),
        ("gpt2", "lm_tied", "onehot", "adamw_clip", None, 1, "", None, "bf16", "shardy", "4x2", "v6e"),
        ("gpt2", "lm", "take", "adamw", "f32_state", 4, "packed zloss", "full", "bf16", "gspmd", "4x2", "v6e"),
        ("gpt2", "vit", "take", None, None, 1, "", None, "f32", "gspmd", "4x2", "v6e"),
        ("gpt2", "vit", "onehot", "adamw_clip", "f32_master", 1, "", "dots", "bf16", "shardy", "2x4", "v5e"),
    )  # fmt: skip
    spellings = {"take": "take_along_axis", "onehot": "one_hot", "f32": "float32", "bf16": "bfloat16"}
    cases = []
    for family, step, ce, optimizer, mixed, k, options, remat, dtype, partitioner, mesh_key, chip in table:
        mesh = LM_MESHES[mesh_key]
        size = _step_size(family, step, rng, spellings[dtype], k * math.prod(map(mesh.size, mesh.batch_axes)))
        pinned = optimizer is not None or "pinned" in options
        case = Case("", "jax", partitioner, remat, size, mesh, family, pinned, chip, step=step,
                    cross_entropy=spellings[ce], optimizer=optimizer, mixed_precision=mixed, microbatches=k,
                    seq_parallel="sp" in options, packed="packed" in options, z_loss="zloss" in options)  # fmt: skip
        cases.append(named(case))
    # 256 chips with Llama 3's vocabulary: an 8B-like step with AdamW and an f32 master copy, and the
    # 405B-shaped remat step as a language model.
    big = (
        (replace(LLAMA_8B, vocab_size=LLAMA3_VOCAB), "one_hot", "adamw_clip", "f32_master", MeshSpec((16, 16))),
        (replace(LLAMA_405B, vocab_size=LLAMA3_VOCAB), "take_along_axis", None, None, MeshSpec((64, 4))),
    )
    for size, ce, optimizer, mixed, mesh in big:
        case = Case("", "jax", "gspmd", "full", size, mesh, "llama", True, "v6e", step="lm", cross_entropy=ce,
                    optimizer=optimizer, mixed_precision=mixed)  # fmt: skip
        cases.append(named(case))
    # torch_xla's LM steps through scan_layers (and a plain loop), AdamW stepped inside the traced graph.
    torch_size = ModelSize(4, 1024, 4096, 8, 8, 128, 8, 256, vocab_size=8192)
    for mode, step, optimizer, remat, mesh in (
        ("scan", "lm", None, None, MeshSpec((4, 2))),
        ("scan", "lm_tied", "adamw", "min_cut", MeshSpec((2, 4))),
        ("loop", "lm", "adamw", None, MeshSpec((4, 2))),
    ):
        case = Case("", "torch_xla", "gspmd", remat, torch_size, mesh, chip="v6e", torch_mode=mode, step=step,
                    cross_entropy="take_along_axis", optimizer=optimizer)  # fmt: skip
        cases.append(named(case))
    return tuple(cases) + transformers_grid()


MIXTRAL_SIZE = ModelSize(4, 256, 512, 8, 2, 32, 8, 64, num_experts=4, vocab_size=4096)


def transformers_grid() -> tuple[Case, ...]:
    """torch_xla steps of transformers' own models, as a user trains one: FSDPv2-style shardings, AdamW, the
    decoder layers through `scan_decoder_layers` (with and without min-cut remat) or the model's own loop;
    Llama, Mistral (sliding-window attention), Gemma (tied head, GeGLU), Qwen2 (q/k/v biases) and Phi-3 (fused
    qkv_proj and gate_up_proj), GQA 8/2; Mixtral (4 experts,
    top 2) smaller: batched_mm gathers each token's experts' weights, and at the others' size one device's
    share outlasts XLA:CPU's 10 s wait for the others at a collective-permute (the run aborts).
    """
    size = ModelSize(4, 512, 1536, 8, 2, 64, 8, 128, vocab_size=16384)
    cases = []
    for model, mode, remat, mesh in (
        ("llama", "scan", None, MeshSpec((4, 2))),
        ("llama", "scan", "min_cut", MeshSpec((2, 4))),
        ("llama", "loop", None, MeshSpec((4, 2))),
        ("mistral", "scan", None, MeshSpec((4, 2))),
        ("gemma", "scan", "min_cut", MeshSpec((4, 2))),
        ("mixtral", "scan", None, MeshSpec((4, 2))),
        ("qwen2", "scan", None, MeshSpec((4, 2))),
        ("qwen2", "loop", None, MeshSpec((4, 2))),
        ("phi3", "scan", None, MeshSpec((4, 2))),
        ("phi3", "scan", "min_cut", MeshSpec((2, 4))),
    ):
        step = "lm_tied" if model == "gemma" else "lm"
        family, sized = ("moe", MIXTRAL_SIZE) if model == "mixtral" else ("llama", size)
        # Mixtral's and Phi-3's modules do not come back from jaxlib's compile path as themselves (MLIR
        # rewrites iotas and transposes of Mixtral's routing, and folds the concatenates and pads of Phi-3's
        # rotary embedding into multiplies), so XLA:TPU cannot be given them faithfully: XLA:CPU only.
        chip = None if model in ("mixtral", "phi3") else "v6e"
        case = Case("", "torch_xla", "gspmd", remat, sized, mesh, family, chip=chip, torch_mode=mode, step=step,
                    cross_entropy="take_along_axis", optimizer="adamw", transformers_model=model)  # fmt: skip
        cases.append(named(case))
    return tuple(cases)


def ci_subset() -> tuple[Case, ...]:
    """The subset the tests regenerate (cached by content), small enough to compile in seconds.

    Together: every family, remat mode (none, full, dots; torch_xla's min_cut), both dtypes, both
    partitioners, both backends and four TPU chips, a 3-axis mesh, pinned gradients, torch_xla's scan
    and plain loop; language-model steps tied and untied, both cross-entropy spellings, AdamW with
    clipping and an f32 master copy (and torch_xla's, with donated buffers), gradient accumulation.
    """
    meshes = {"4x2": MeshSpec((4, 2)), "2x4": MeshSpec((2, 4)), "1x8": MeshSpec((1, 8)), "8x1": MeshSpec((8, 1)),
              "3d": MeshSpec((2, 2, 2), ("data", "fsdp", "tp"))}  # fmt: skip
    table = (
        ("llama", None, "float32", "gspmd", "4x2", False, "v6e"),
        ("llama", "full", "bfloat16", "shardy", "2x4", True, "v5e"),
        ("llama", "dots", "float32", "gspmd", "3d", False, "v4"),
        ("gpt2", None, "bfloat16", "gspmd", "1x8", False, "v6e"),
        ("gpt2", "full", "float32", "shardy", "4x2", True, "v5p"),
        ("gpt2", "dots", "bfloat16", "gspmd", "8x1", False, "v6e"),
        ("mlp", None, "float32", "shardy", "2x4", False, "v5e"),
        ("mlp", "dots", "bfloat16", "gspmd", "4x2", True, "v6e"),
        ("moe", None, "bfloat16", "gspmd", "4x2", False, "v6e"),
        ("moe", "full", "float32", "gspmd", "2x4", False, "v6e"),
    )
    # Large enough that XLA:TPU's temporaries overflow on-chip memory (else TPU totals are arguments
    # and outputs alone), small enough to compile in seconds.
    sizes = {
        "llama": ModelSize(4, 1024, 2816, 8, 2, 128, 8, 512, "float32"),
        "gpt2": ModelSize(4, 768, 3072, 8, 8, 96, 8, 512, "float32"),
        "mlp": ModelSize(4, 2048, 8192, 8, 8, 256, 8, 512, "float32"),
        "moe": ModelSize(4, 1024, 2048, 8, 8, 128, 8, 256, "float32", num_experts=4),
    }
    cases = []
    for family, remat, dtype, partitioner, mesh_name, pinned, chip in table:
        size = replace(sizes[family], dtype=dtype)
        mesh = meshes[mesh_name]
        name = "ci_" + _name("jax", family, remat, size, partitioner, mesh, pinned)
        cases.append(Case(name, "jax", partitioner, remat, size, mesh, family, pinned, chip))
    small = ModelSize(num_layers=4, hidden_size=512, ffn_size=2048, num_heads=8, head_size=64, seq_len=128)
    for mode, remat in (("scan", "min_cut"), ("loop", None)):
        name = "ci_" + _name("torch_xla", "llama", remat, small, "gspmd", MeshSpec((4, 2)), False, f"_{mode}")
        cases.append(Case(name, "torch_xla", "gspmd", remat, small, MeshSpec((4, 2)), chip="v6e", torch_mode=mode))
    # torch_xla's whole step: a tied language model through scan_layers with AdamW, whose parameters and
    # moments torch_xla donates (`buffer_donor`).
    case = Case("", "torch_xla", "gspmd", "min_cut", replace(small, vocab_size=4096), MeshSpec((2, 4)), chip="v6e",
                torch_mode="scan", step="lm_tied", cross_entropy="take_along_axis", optimizer="adamw")  # fmt: skip
    cases.append(named(case, "ci_"))
    # transformers' Llama as a torch_xla user trains it: its decoder layers through scan_decoder_layers, AdamW.
    hf = ModelSize(4, 256, 768, 8, 2, 32, 8, 64, vocab_size=4096)
    case = Case("", "torch_xla", "gspmd", None, hf, MeshSpec((4, 2)), chip="v6e", torch_mode="scan", step="lm",
                cross_entropy="take_along_axis", optimizer="adamw", transformers_model="llama")  # fmt: skip
    cases.append(named(case, "ci_"))
    # Whole steps: a GSPMD language model, a tied one with AdamW over bf16 params (f32 master copy,
    # clipped), and gradient accumulation under Shardy.
    lm = replace(sizes["llama"], vocab_size=8192)
    for step, ce, optimizer, mixed, k, remat, dtype, partitioner, mesh_name, chip in (
        ("lm", "take_along_axis", None, None, 1, None, "float32", "gspmd", "4x2", "v6e"),
        ("lm_tied", "one_hot", "adamw_clip", "f32_master", 1, None, "bfloat16", "gspmd", "2x4", "v5e"),
        ("lm", "take_along_axis", None, None, 2, "full", "float32", "shardy", "4x2", "v6e"),
    ):
        case = Case("", "jax", partitioner, remat, replace(lm, dtype=dtype), meshes[mesh_name], "llama",
                    optimizer is not None, chip, step=step, cross_entropy=ce, optimizer=optimizer,
                    mixed_precision=mixed, microbatches=k)  # fmt: skip
        cases.append(named(case, "ci_"))
    return tuple(cases)


def accumulation_pairs() -> tuple[Case, ...]:
    """Gradient accumulation, each step free and pinned: an outer lax.scan over microbatches around the
    layer scan, gradients summed in f32. The free step is what a user hands over; the pinned one (every
    gradient returned in its parameter's sharding) is what the plan's placements must bring it to.

    The toy loss on 2D meshes, where XLA leaves the inner backward loop's stacked gradients and the
    outer loop's accumulators split over tp alone, with and without remat; and a language model, where
    XLA keeps them sharded and only the embedding's gradient is short (nothing to claim in the loops).
    """
    toy = ModelSize(4, 1024, 2816, 8, 2, 128, 16, 512, "float32")
    lm = replace(toy, batch_size=8, vocab_size=8192)
    cases = []
    for step, k, remat, size, mesh in (
        ("toy", 2, None, toy, MeshSpec((4, 2))),
        ("toy", 4, "full", toy, MeshSpec((2, 4))),
        ("lm", 2, None, lm, MeshSpec((4, 2))),
    ):
        for pinned in (False, True):
            case = Case("", "jax", "gspmd", remat, size, mesh, "llama", pinned, "v6e", step=step,
                        cross_entropy=None if step == "toy" else "take_along_axis", microbatches=k)  # fmt: skip
            if step == "toy":
                name = _name("jax", "llama", remat, size, "gspmd", mesh, pinned, f"_accum{k}")
                cases.append(replace(case, name=name))
            else:
                cases.append(named(case))
    return tuple(cases)


CI_SUBSET: tuple[Case, ...] = ci_subset()
ACCUMULATION_CASES: tuple[Case, ...] = accumulation_pairs()
CASES: tuple[Case, ...] = FIXTURE_CASES + grid() + CI_SUBSET + NEXT_STEP_CASES + ACCUMULATION_CASES
CI_CASES: tuple[str, ...] = tuple(c.name for c in CI_SUBSET)


def _check_unique(cases: tuple[Case, ...]) -> None:
    seen: dict[str, Case] = {}
    for case in cases:
        if seen.get(case.name, case) != case:
            raise ValueError(f"two different cases are named {case.name!r}")
        seen[case.name] = case


_check_unique(CASES)


def case_named(name: str) -> Case:
    for case in CASES:
        if case.name == name:
            return case
    raise ValueError(f"no case named {name!r}; known: {len(CASES)} cases, e.g. {', '.join(c.name for c in CASES[:3])}")

"""Logical buffers after partitioning: which values share memory, and their per-device size.

A value is one array leaf produced by one instruction. Values that XLA keeps
in one allocation form a buffer:
- views do not allocate: get-tuple-element, tuple, opt-barrier, bitcast, and reshapes
  (with the default layouts XLA's layout assignment gives, they are bitcasts), and
  Sharding custom-calls that keep their operand's sharding (XLA's sharding remover
  points their users at the operand; the copy it leaves behind is dead code);
- a While's carried element lives in one buffer with its init element, the
  body's parameter and root elements (XLA copies the init only if it is an
  entry parameter or is still read after the loop);
- a dynamic-update-slice writes into its operand when that operand dies there.
Elementwise chains fused by XLA do not materialise either: a value whose only
readers are fusible ops in the same computation is not a buffer of its own.

Per-device size: each dim becomes ceil(dim / tiles) under the value's
sharding; f32[8,1024,4096] under {devices=[1,4,2]<=[8]} is f32[8,256,2048],
16,777,216 bytes on every device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.hlo.ir.opcodes import BINARY_ELEMENTWISE, TERNARY_ELEMENTWISE, UNARY_ELEMENTWISE
from planner.hlo.ir.shapes import ArrayShape, Shape, TupleShape
from planner.propagation import PropagationResult
from planner.sharding.hlo_sharding import HloSharding, Kind

# Values a fused consumer computes on the fly from its producers.
FUSIBLE = (
    UNARY_ELEMENTWISE
    | BINARY_ELEMENTWISE
    | TERNARY_ELEMENTWISE
    | frozenset("broadcast reshape slice pad iota concatenate dynamic-slice reduce transpose".split())
)
# Ops XLA:CPU's fusion duplicates into every consumer rather than materialise.
_CHEAP = frozenset("broadcast reshape iota slice convert".split())
# XLA's InstructionFusion duplicates a producer into all its consumers unless it is expensive
# (`InstructionFusion::IsExpensive`: add, subtract, multiply, compares, selects, converts and data
# movement are cheap; the list below is the subset the model's fusible opcodes hold), and an
# accelerator's fusion counts f32/f16 exponentials, divides and square roots cheap too
# (`GpuInstructionFusion::IsExpensive`). XLA:TPU's buffer assignment agrees: on
# MaxText's Llama step the softmax's f32 `[batch, seq, vocab]` subtract and exponential, each read by
# two consumers, hold no buffer; only the bf16 logits and their gradient do.
RECOMPUTED_BY_ACCELERATOR_FUSION = frozenset(
    """add and broadcast clamp compare concatenate convert copy dynamic-slice maximum minimum multiply
    negate not or pad reshape reverse select slice subtract transpose xor iota""".split()
)
_ACCELERATOR_CHEAP_FLOAT_MATH = frozenset("exponential divide sqrt rsqrt".split())
_VIEWS = frozenset({"get-tuple-element", "tuple", "bitcast", "reshape", "parameter", "opt-barrier"})


Value = tuple[str, str, int]  # (computation, instruction, leaf index)


def array_leaves(shape: Shape) -> tuple[ArrayShape, ...]:
    """The arrays of a shape, in order: the shape itself when it is not a tuple."""
    return shape.leaves() if isinstance(shape, TupleShape) else (shape,)  # type: ignore[return-value]


@dataclass
class Buffer:
    """One allocation: a set of values that share memory."""

    id: int
    size_bytes: int
    defined_by: str
    computation: str
    shape: ArrayShape
    sharding: HloSharding | None
    category: str = "temporary"  # parameter | output | loop-carried | temporary | constant
    device: int | None = None  # a maximal sharding pins the buffer to one chip
    start: int = 0
    end: int = 0
    loop: str | None = None  # the While whose carried tuple holds it
    values: list[Value] = field(default_factory=list)
    # What each device holds when it is not `shape`'s shard under `sharding` (a bf16 value XLA:CPU keeps
    # in f32, a partitioner's gathered operand), and why; `size_bytes` is `held.byte_size` unless `note`
    # says otherwise.
    stored: ArrayShape | None = None
    note: str | None = None

    @property
    def held(self) -> ArrayShape:
        """The per-device array: f32[8,1024,4096] under {devices=[1,4,2]<=[8]} holds f32[8,256,2048]."""
        if self.stored is not None:
            return self.stored
        sharding = self.sharding
        if sharding is None or sharding.kind is not Kind.TILED:
            return self.shape
        return ArrayShape(self.shape.element_type, sharding.shard_shape(self.shape.dims), layout=self.shape.layout)

    @property
    def is_stacked(self) -> bool:
        return self.loop is not None and self.shape.rank >= 2


def leaf_shardings(shape: Shape, sharding: HloSharding | None) -> list[HloSharding | None]:
    leaves = array_leaves(shape)
    if sharding is None:
        return [None] * len(leaves)
    if sharding.is_tuple:
        if not isinstance(shape, TupleShape):
            # An array-valued op carrying its operand tuple's sharding (outfeed's token result).
            return [None] * len(leaves)
        return list(sharding.elements) + [None] * (len(leaves) - len(sharding.elements))
    return [sharding] * len(leaves)


def per_device_bytes(shape: ArrayShape, sharding: HloSharding | None) -> int:
    if sharding is None or sharding.kind is not Kind.TILED:
        return shape.byte_size
    return shape.bytes_for_dims(sharding.shard_shape(shape.dims))


def is_sharding_annotation(inst: Instruction) -> bool:
    """A Sharding custom-call: an annotation for propagation, not a computation."""
    return inst.opcode == "custom-call" and inst.attr("custom_call_target") == "Sharding"


def readers(comp: Computation, name: str) -> list[str]:
    """The instructions that read a value once its Sharding annotations are gone: their readers stand in for them."""
    found: list[str] = []
    for user in comp.users(name):
        if is_sharding_annotation(comp[user]) and user != comp.root_name:
            found += readers(comp, user)
        else:
            found.append(user)
    return found


def _recomputed(inst: Instruction, accelerator: bool) -> bool:
    """Whether fusion computes `inst` again in each of several consumers instead of storing it."""
    if not accelerator:
        return inst.opcode in _CHEAP
    if inst.opcode in RECOMPUTED_BY_ACCELERATOR_FUSION:
        return True
    shape = inst.shape
    return (
        inst.opcode in _ACCELERATOR_CHEAP_FLOAT_MATH
        and isinstance(shape, ArrayShape)
        and shape.element_type in ("f32", "f16")
    )


def materialises(comp: Computation, inst: Instruction, accelerator: bool = False) -> bool:
    """Whether XLA gives this instruction's value a buffer of its own after fusion (`accelerator`: as XLA:TPU's
    and XLA:GPU's fusion decides it, else XLA:CPU's)."""
    if inst.opcode in _VIEWS or is_sharding_annotation(inst):
        return False
    if inst.opcode == "constant" and accelerator:
        # XLA:TPU's buffer assignment gives constants allocations of their own, outside its temporaries
        # (and the model counts them nowhere: they are part of the program, not of a step's HBM).
        return False
    if inst.opcode not in FUSIBLE or inst.opcode == "reduce":
        return True
    users = readers(comp, inst.name)
    if not users or inst.name == comp.root_name:
        return True
    # Read by several fusions, only cheap ops are recomputed in each; others get a buffer.
    if len(users) > 1 and not _recomputed(inst, accelerator):
        return True
    # Fused into its readers only if every reader is itself fusible.
    return not all(comp[u].opcode in FUSIBLE for u in users)


def module_leaf_count(shape: Shape) -> int:
    return len(shape.leaves()) if isinstance(shape, TupleShape) else 1


def sharding_of(result: PropagationResult, name: str) -> HloSharding | None:
    return result.sharding(name) if name in result else None


__all__ = [
    "Buffer",
    "HloModule",
    "Value",
    "array_leaves",
    "is_sharding_annotation",
    "leaf_shardings",
    "materialises",
    "per_device_bytes",
    "readers",
    "sharding_of",
]

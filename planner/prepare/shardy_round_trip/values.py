"""The values, reads and loops the round trip's three steps speak of, as StableHLO has them."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from planner.hlo.ir.module import Computation, Instruction
from planner.hlo.ir.shapes import ArrayShape, Shape

# StableHLO's prepare-for-export rewrites a splat constant of this many elements or more as a
# broadcast of a scalar (`prepareConstantOp`).
SPLAT_MIN_ELEMENTS = 32
_LITERAL_TOKEN = re.compile(r"-?(?:inf|nan|true|false|[0-9.]+(?:e[-+]?[0-9]+)?)", re.IGNORECASE)
_GLOBAL_TO_LOCAL = "xla.sdy.GlobalToLocalShape"
RETURN = ""  # the holder of a computation's result when its root is not a tuple


@dataclass(frozen=True)
class Val:
    """A value as StableHLO has it: instruction `name`, element `index` of a tuple-shaped one (a
    While's result, a loop's parameter), or the splitter's copy number `clone` of a constant."""

    comp: str
    name: str
    index: int | None = None
    clone: int | None = None

    @property
    def original(self) -> Val:
        return dataclasses.replace(self, clone=None)


@dataclass(frozen=True)
class TupleRef:
    """A `tuple` instruction: StableHLO has none, its readers read its operands."""

    comp: str
    name: str


# A read: operand `slot` of instruction `holder` of computation `comp` (`RETURN`: the root itself).
Use = tuple[str, str, int]


@dataclass
class Loop:
    comp: str
    name: str
    init: str
    cond: str
    body: str
    arity: int
    dropped: set[int] = field(default_factory=set)
    captures: list[Val] = field(default_factory=list)

    @property
    def kept(self) -> list[int]:
        return [i for i in range(self.arity) if i not in self.dropped]


def same_type(a: Shape, b: Shape) -> bool:
    return isinstance(a, ArrayShape) and isinstance(b, ArrayShape) and a.to_text(False) == b.to_text(False)


def rank(shape: Shape) -> int:
    return shape.rank if isinstance(shape, ArrayShape) else -1


def is_big_splat(inst: Instruction) -> bool:
    shape, literal = inst.shape, inst.literal or ""
    if not isinstance(shape, ArrayShape) or shape.num_elements < SPLAT_MIN_ELEMENTS or "..." in literal:
        return False
    return len(set(_LITERAL_TOKEN.findall(literal))) == 1


def shard_map_of(comp: Computation, inst: Instruction) -> str | None:
    """The shard_map whose in-sharding `inst` holds, if it is one: libtpu 0.0.52 writes each operand's
    in-sharding as a side-effecting `Sharding` call read only by the shard_map's GlobalToLocalShape
    (`planner.propagation.shardy.manual_hlo`). The import builds `sdy.manual_computation` in place of
    the shard_map's body call (`ManualComputationPattern`, shard_map_import.cc) with the in-shardings
    as its own attribute, so the operand is read where the manual computation stands, not where the
    call holding its sharding was printed: the exporter captures a pass-through operand there
    (a Llama step's splash-attention masks after the layer's weights, as XLA:TPU's capture order)."""
    if inst.opcode != "custom-call" or inst.attr("custom_call_target") != "Sharding":
        return None
    if not inst.attr("custom_call_has_side_effect"):
        return None
    users = comp.users(inst.name)
    if len(users) != 1 or comp[users[0]].attr("custom_call_target") != _GLOBAL_TO_LOCAL:
        return None
    return users[0]


def control_predecessors(inst: Instruction) -> list[str]:
    raw = inst.attr("control-predecessors")
    text = getattr(raw, "text", "") if raw is not None else ""
    return [n.strip().lstrip("%") for n in text.strip("{}").split(",") if n.strip()]

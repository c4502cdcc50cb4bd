"""Check that StableHLO comes back from jaxlib's compile path as the HLO module it was made from.

`exported_hlo` runs the path `Client.compile` runs before any XLA pass (`MlirToXlaComputation`:
MLIR's canonicalizer, then the export to HLO); `check_round_trip` compares what comes out, calls
inlined as XLA inlines them before sharding propagation, with the original, instruction for
instruction (`planner.hlo.ir.fingerprint`). The changes it accepts are the ones nothing can prevent,
because mhlo makes them of an op alone in a computation of its own (`canonicalized_alone`): an
identity op folds into its operand (`identity_of`), and an iota of rank 2 or more whose other dims
are all 1 becomes a 1-D iota and a reshape (`split_iota_of`), and a convert from an integer to pred is
exported as a compare against zero (`compare_of`). None moves XLA:TPU's GSPMD (an
identity broadcast can move XLA:CPU's: see `identity_of`). An instruction either rewrites that
carries a sharding is a user's annotation MLIR would drop, and is refused. The header's buffer
donors and input/output aliases must come back too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable

from planner.errors import UnfaithfulConversion
from planner.hlo.ir.attributes import Raw
from planner.hlo.ir.fingerprint import Fingerprint
from planner.hlo.ir.module import Attribute, Computation, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.hlo.structure.inline import inline_calls
from planner.hlo.text.parser import parse_hlo
from planner.memory.donation import buffer_donors

# Ops mhlo's folders replace by their operand when the result type is the operand's.
_IDENTITY_OPCODES = frozenset({"broadcast", "concatenate", "convert", "reshape", "transpose"})


def identity_of(comp: Computation, inst: Instruction) -> str | None:
    """The operand `inst` folds to in MLIR whatever surrounds it, else None.

    mhlo's folders (xla/mlir_hlo/mhlo/IR/hlo_ops.cc): `broadcast_in_dim` of the same type with dims
    0..rank-1, `convert` and `reshape` to the same type, `transpose` by the identity permutation, and
    `concatenate` of one operand of the same type (`ConcatenateOp::fold`). Example: `%c = f32[4,8]{1,0}
    convert(f32[4,8]{1,0} %x)` folds to `%x`, and so does `%c = s64[2048,1] concatenate(s64[2048,1]
    %x), dimensions={1}` (the scatter indices of torch_xla's `take` gradient); `%c = bf16[4,8]
    convert(%x)` does not.

    An unannotated identity convert, reshape, transpose or concatenate is invisible to GSPMD:
    propagation passes a sharding through each unchanged, both ways, from aggressiveness 0. An
    identity broadcast is not: propagation crosses a broadcast only at higher aggressiveness
    (sharding_propagation.cc), and folding one can move XLA:CPU. Measured on
    torch_xla_llama_scan_lm_take_V8192 (fsdp4_tp2): folding the one identity `f32[8,8,256,256]
    broadcast` of the attention mask's select takes torch_xla's own XLA:CPU from 588,352,065 to
    570,509,769 B per device; XLA:TPU gives the HLO proto's bytes with or without the folds on the
    three LM cases (libtpu's PJRT C API on the proto). Nothing keeps an identity from folding, so
    the fold is accepted, and the conversion stands for XLA:TPU, not for XLA:CPU, on such modules.
    """
    if inst.opcode not in _IDENTITY_OPCODES or len(inst.operands) != 1:
        return None
    source = comp[inst.operands[0]].shape
    if not (isinstance(source, ArrayShape) and isinstance(inst.shape, ArrayShape)):
        return None
    if (source.element_type, source.dims) != (inst.shape.element_type, inst.shape.dims):
        return None
    if inst.opcode in ("broadcast", "transpose") and tuple(inst.attr("dimensions") or ()) != tuple(range(source.rank)):
        return None
    return inst.operands[0]


def split_iota_of(comp: Computation, inst: Instruction) -> tuple[Instruction, Instruction] | None:
    """The 1-D iota and the reshape MLIR makes of `inst` whatever surrounds it, else None.

    mhlo's `IotaBroadcast` canonicalization (xla/mlir_hlo/mhlo/IR/hlo_ops.cc) rewrites every iota of
    rank 2 or more as a 1-D iota along its iota dim and a `broadcast_in_dim` back to its shape; when
    every other dim is 1 the broadcast adds no elements and BroadcastInDimSimplifier makes it a
    reshape. Example: `%i = s64[1,8192]{1,0} iota(), iota_dimension=1` (the one-hot compare of
    torch_xla's LM loss) comes back as `%i.split = s64[8192]{0} iota(), iota_dimension=0` and `%i =
    s64[1,8192]{1,0} reshape(%i.split)`; the returned reshape keeps the name, so readers are unchanged.

    Why GSPMD decides the same when the iota is unannotated: an iota has no operand, so its sharding
    comes from its readers only; a reshape that only adds size-1 dims maps any sharding between its
    operand and result exactly, in both directions, from aggressiveness 0; so the 1-D iota ends up
    with the original's sharding less the size-1 dims, and the reshape between them is a bitcast once
    partitioned. Not split: an iota whose iota dim is 1 (mhlo folds it to a zero constant instead),
    and one with another dim above 1 (a real broadcast, which propagation treats differently): the
    round-trip check refuses those.
    """
    shape = inst.shape
    if inst.opcode != "iota" or not isinstance(shape, ArrayShape) or shape.rank < 2 or any(shape.dynamic):
        return None
    dim = inst.attr("iota_dimension")
    if not isinstance(dim, int) or shape.dims[dim] == 1:
        return None
    if any(size != 1 for d, size in enumerate(shape.dims) if d != dim):
        return None
    name = f"{inst.name}.split"
    while name in comp:
        name += "_"
    dims_attr = Attribute("iota_dimension", 0, "0")
    attributes = tuple(dims_attr if a.key == "iota_dimension" else a for a in inst.attributes)
    shape_1d = ArrayShape(shape.element_type, (shape.dims[dim],), layout="{0}")
    iota = dataclasses.replace(inst, name=name, shape=shape_1d, attributes=attributes)
    metadata = tuple(a for a in inst.attributes if a.key == "metadata")
    reshape = Instruction(inst.name, "reshape", shape, (name,), metadata, line=inst.line)
    return iota, reshape


# Integer element types: a convert from one of them to pred leaves MLIR as a compare against zero.
_INTEGER_TYPES = frozenset({"s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64"})


def compare_of(comp: Computation, inst: Instruction) -> tuple[Instruction, ...] | None:
    """The zero constant, its broadcast and the `compare NE` the export to HLO makes of `inst`, else None.

    MLIR has no conversion to i1 that HLO's `convert` spells: the export writes `convert(x)` from an
    integer to pred as `x != 0`, XLA's own definition of that convert. Example: `%c = pred[1,1,128,128]
    convert(u8[1,1,128,128] %m)` (transformers' sliding-window mask, built in u8 by torch_xla) comes back
    as `%c.zero = u8[] constant(0)`, `%c.zeros = u8[1,1,128,128] broadcast(%c.zero)` and `%c = pred[...]
    compare(%m, %c.zeros), direction=NE`; the compare keeps the name, so readers are unchanged.

    Why GSPMD decides the same when the convert is unannotated: the compare is elementwise, as the convert
    is, and its other operand is a broadcast of a scalar, which has no sharding of its own to give; the
    sharding passes between `%m` and `%c` unchanged in both directions.
    """
    shape = inst.shape
    if inst.opcode != "convert" or not isinstance(shape, ArrayShape) or shape.element_type != "pred":
        return None
    source = comp[inst.operands[0]].shape
    if not isinstance(source, ArrayShape) or source.element_type not in _INTEGER_TYPES:
        return None
    zero, zeros = f"{inst.name}.zero", f"{inst.name}.zeros"
    while zero in comp or zeros in comp:
        zero, zeros = zero + "_", zeros + "_"
    constant = Instruction(zero, "constant", ArrayShape(source.element_type, ()), (), literal="0", line=inst.line)
    broadcast = Instruction(zeros, "broadcast", dataclasses.replace(source), (zero,),
                            (Attribute("dimensions", (), "{}"),), line=inst.line)  # fmt: skip
    metadata = tuple(a for a in inst.attributes if a.key == "metadata")
    compare = Instruction(inst.name, "compare", shape, (inst.operands[0], zeros),
                          (Attribute("direction", "NE", "NE"), *metadata), line=inst.line)  # fmt: skip
    return constant, broadcast, compare


@dataclasses.dataclass(frozen=True)
class Canonicalized:
    """The module as mhlo's canonicalizer leaves each op alone, and what it changed."""

    module: HloModule
    # Identity instructions (unannotated) folded into their operands.
    folded_identities: tuple[str, ...]
    # Iotas (unannotated) written as a 1-D iota and a reshape.
    split_iotas: tuple[str, ...]


def canonicalized_alone(module: HloModule) -> Canonicalized:
    """Identities folded (readers and roots take the operand), unit-dim iotas split; raises for a sharded one."""
    folded: list[str] = []
    split: list[str] = []
    computations = []
    for comp in module.computations:
        alias: dict[str, str] = {}
        kept: list[Instruction] = []
        for inst in comp:
            operands = tuple(alias.get(o, o) for o in inst.operands)
            target = identity_of(comp, inst)
            if target is not None:
                _refuse_sharded(inst, f"an identity {inst.opcode}", "folds it away")
                alias[inst.name] = alias.get(target, target)
                folded.append(inst.name)
                continue
            compared = compare_of(comp, dataclasses.replace(inst, operands=operands))
            if compared is not None:
                _refuse_sharded(inst, "a convert to pred", "writes it as a compare against zero")
                kept.extend(compared)
                continue
            parts = split_iota_of(comp, inst)
            if parts is not None:
                _refuse_sharded(inst, f"an iota {inst.shape.to_text(False)}", "rewrites it as a 1-D iota and a reshape")
                kept.extend(parts)
                split.append(inst.name)
                continue
            kept.append(dataclasses.replace(inst, operands=operands) if operands != inst.operands else inst)
        # A root folds too: the computation then returns the operand (a call of it, once inlined, is the operand).
        root = alias.get(comp.root_name, comp.root_name)
        computations.append(dataclasses.replace(comp, instructions=tuple(kept), root_name=root))
    return Canonicalized(dataclasses.replace(module, computations=tuple(computations)), tuple(folded), tuple(split))


def _refuse_sharded(inst: Instruction, what: str, rewrite: str) -> None:
    if inst.sharding is not None:
        raise UnfaithfulConversion(
            f"{inst.name} is {what} with sharding {inst.sharding.to_text()}: MLIR {rewrite} and drops the annotation"
        )


def _header_text(module: HloModule, key: str) -> str | None:
    """A header attribute the parser keeps as text (`Raw`), without whitespace; None when absent."""
    value = module.attr(key)
    if value is None:
        return None
    return "".join((value.text if isinstance(value, Raw) else str(value)).split())


def exported_hlo(mlir: bytes) -> str:
    """The HLO text jaxlib's compile path makes of `mlir`, canonicalizer included, before any XLA pass."""
    from planner.hlo.text import jaxlib_api

    return str(jaxlib_api.stablehlo_to_computation(mlir).as_hlo_text())


def check_round_trip(original: HloModule, mlir: bytes) -> None:
    """Raise UnfaithfulConversion unless `mlir` exports to `original` (calls inlined, `canonicalized_alone`)."""
    table: dict[Hashable, int] = {}
    exported = parse_hlo(exported_hlo(mlir))
    if buffer_donors(exported) != buffer_donors(original):
        raise UnfaithfulConversion(
            f"its StableHLO comes back from jaxlib's compile path donating parameters "
            f"{sorted(buffer_donors(exported))} where the module donates {sorted(buffer_donors(original))}"
        )
    aliases = [_header_text(m, "input_output_alias") for m in (original, exported)]
    if aliases[0] != aliases[1]:
        raise UnfaithfulConversion(
            f"its StableHLO comes back from jaxlib's compile path with input_output_alias={aliases[1]} where the "
            f"module has {aliases[0]}"
        )
    expected = Fingerprint(canonicalized_alone(inline_calls(original).module).module, table)
    actual = Fingerprint(inline_calls(exported).module, table)
    if expected.digest == actual.digest:
        return
    raise UnfaithfulConversion(
        "its StableHLO does not come back from jaxlib's compile path as the same module: instructions of the "
        f"module with no counterpart: {', '.join(expected.unmatched(actual)) or 'none'}; of what comes back: "
        f"{', '.join(actual.unmatched(expected)) or 'none'}"
    )

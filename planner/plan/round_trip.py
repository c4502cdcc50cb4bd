"""Check that StableHLO comes back from jaxlib's compile path as the HLO module it was made from.

`exported_hlo` runs the path `Client.compile` runs before any XLA pass (`MlirToXlaComputation`:
MLIR's canonicalizer, then the export to HLO); `check_round_trip` compares what comes out, calls
inlined as XLA inlines them before sharding propagation, with the original, instruction for
instruction (`planner.hlo.fingerprint`). The one change it accepts is the one nothing can prevent:
an identity op folds into its operand even alone in a computation of its own (`fold_identities`).
An identity that carries a sharding is a user's annotation that would be lost, and is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable

from planner.errors import UnfaithfulConversion
from planner.hlo.fingerprint import Fingerprint
from planner.hlo.inline import inline_calls
from planner.hlo.ir import Computation, HloModule, Instruction
from planner.hlo.parser import parse_hlo
from planner.hlo.shapes import ArrayShape

# Ops mhlo's folders replace by their operand when the result type is the operand's.
_IDENTITY_OPCODES = frozenset({"broadcast", "convert", "reshape", "transpose"})


def identity_of(comp: Computation, inst: Instruction) -> str | None:
    """The operand `inst` folds to in MLIR whatever surrounds it, else None.

    mhlo's folders: `broadcast_in_dim` of the same type with dims 0..rank-1, `convert` and `reshape`
    to the same type, `transpose` by the identity permutation. Example: `%c = f32[4,8]{1,0}
    convert(f32[4,8]{1,0} %x)` folds to `%x`; `%c = bf16[4,8] convert(%x)` does not.
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


@dataclasses.dataclass(frozen=True)
class Folded:
    """The module as MLIR's folders leave it, and the names of the identity instructions they removed."""

    module: HloModule
    names: tuple[str, ...]


def fold_identities(module: HloModule) -> Folded:
    """Each identity instruction replaced by its operand in every reader, roots included; raises for a sharded one."""
    names: list[str] = []
    computations = []
    for comp in module.computations:
        alias: dict[str, str] = {}
        kept = []
        for inst in comp:
            operands = tuple(alias.get(o, o) for o in inst.operands)
            target = identity_of(comp, inst)
            if target is not None:
                if inst.sharding is not None:
                    raise UnfaithfulConversion(
                        f"{inst.name} is an identity {inst.opcode} with sharding {inst.sharding.to_text()}: MLIR "
                        "folds it away and the annotation with it"
                    )
                alias[inst.name] = alias.get(target, target)
                names.append(inst.name)
                continue
            kept.append(dataclasses.replace(inst, operands=operands) if operands != inst.operands else inst)
        # A root folds too: the computation then returns the operand (a call of it, once inlined, is the operand).
        root = alias.get(comp.root_name, comp.root_name)
        computations.append(dataclasses.replace(comp, instructions=tuple(kept), root_name=root))
    return Folded(dataclasses.replace(module, computations=tuple(computations)), tuple(names))


def exported_hlo(mlir: bytes) -> str:
    """The HLO text jaxlib's compile path makes of `mlir`, canonicalizer included, before any XLA pass."""
    from jax._src.lib import xla_client

    computation = xla_client._xla.mlir.mlir_module_to_xla_computation(mlir, use_tuple_args=False, return_tuple=False)
    return str(computation.as_hlo_text())


def check_round_trip(original: HloModule, mlir: bytes) -> None:
    """Raise UnfaithfulConversion unless `mlir` exports to `original` (calls inlined, identities folded)."""
    table: dict[Hashable, int] = {}
    expected = Fingerprint(fold_identities(inline_calls(original).module).module, table)
    actual = Fingerprint(inline_calls(parse_hlo(exported_hlo(mlir))).module, table)
    if expected.digest == actual.digest:
        return
    raise UnfaithfulConversion(
        "its StableHLO does not come back from jaxlib's compile path as the same module: instructions of the "
        f"module with no counterpart: {', '.join(expected.unmatched(actual)) or 'none'}; of what comes back: "
        f"{', '.join(actual.unmatched(expected)) or 'none'}"
    )

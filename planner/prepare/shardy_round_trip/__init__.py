"""The While loops as XLA's `shardy-xla` pass leaves them: its HLO -> StableHLO -> HLO round trip.

`shardy-xla` (xla/service/spmd/shardy/shardy_xla_pass.cc) converts the module to StableHLO, runs
Shardy's import, propagation and export there, and converts back. Three steps of that trip change
what every While carries, and so the loops the partitioner works on:

1. Pass-through elements become implicit captures. `WhileOpImplicitCapture` (run to a fixed point
   by `stablehlo_canonicalize_from_hlo_import.cc`, xla/mlir_hlo/stablehlo_ext/transforms) drops
   element i when the body returns, at position i, its own block argument i or the very value the
   loop starts element i with; so an element returning a dropped twin's argument, with the same
   starting value, goes on the next round. The condition, the body and the readers of result i
   after the loop read that starting value instead. The counter, updated carries and elements
   returned at another position stay, in their order. Only what reads a dropped element makes a
   capture (a kept element returning its value too); a dropped element nothing reads is gone.
2. Constant expressions are copied per reader (Shardy's `ConstantOrScalarSplitter`,
   shardy/dialect/sdy/transforms/import/constant_or_scalar_splitter.cc): each op that is not itself
   a constant expression gets its own copy, beside the original, of every non-scalar expression
   it reads that is built from constants and iotas through broadcasts, reshapes, slices and
   elementwise ops (not through a sharding constraint), and of every broadcast of a scalar. A
   RoPE table the body reads twice is two values; a mask the body reads once is one. Shardy's
   export (`ConstantOrScalarMerger`) folds copies of one broadcast of a scalar back together when
   their attributes, sharding included, are equal.
3. The exporter re-adds the captures as elements (`ExportXlaOp(WhileOp)`,
   xla/hlo/translate/mhlo_to_hlo/mlir_hlo_to_hlo.cc): `getUsedValuesDefinedAbove` over the
   condition, then the body, each walked in post-order (a nested loop's regions before its own
   operands; ops in `MakeInstructionPostOrder`, the order the importer reads HLO in), lists each
   captured value once, at its first read. They follow the kept elements and the body passes them
   through. A captured constant is copied into the loop instead (measured: a scalar constant the
   exported MLIR captures is no element of the HLO).

Each step is a module named for what it mirrors: `implicit_capture` (1), `constant_splitter` (2) and
`while_export` (3, and the module written back as HLO); `values` holds what they speak of.

Worked example (XLA:TPU, Llama step, measured): the forward scan carries 40 elements: the counter,
27 updated carries, then 9 weights, `cos`, `sin` and a mask passed through. After the trip it
carries 46: the 28 kept ones, then the weights, four copies of `cos` and four of `sin` (the body
reshapes each once and four ops read the reshape) and the mask, in the order the body first reads
them. A splat constant of 32 elements or more would be captured as a broadcast (Shardy's import
rewrites it so first, `StablehloPrepareForHloExportPass`); no step measured has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from planner.errors import UnsupportedHlo
from planner.hlo.ir.frontend_attributes import FrontendAttributes
from planner.hlo.ir.module import HloModule, Instruction
from planner.hlo.ir.shapes import TupleShape
from planner.prepare.edit import ComputationEdit, ModuleEdit, get_tuple_element, tuple_of
from planner.prepare.rewrite import Rewrite
from planner.prepare.shardy_round_trip.constant_splitter import ConstantSplit
from planner.prepare.shardy_round_trip.implicit_capture import ImportedModule
from planner.prepare.shardy_round_trip.while_export import Rebuild, find_captures


@dataclass(frozen=True)
class ShardyRoundTrip:
    NAME: ClassVar[str] = "shardy-xla"
    MIRRORS: ClassVar[str] = (
        "xla/service/spmd/shardy/shardy_xla_pass.cc: WhileOpImplicitCapture "
        "(stablehlo_canonicalize_from_hlo_import.cc), constant_or_scalar_splitter.cc and _merger.cc, "
        "ExportXlaOp(WhileOp) (mlir_hlo_to_hlo.cc)"
    )

    # Copies of one broadcast of a scalar are merged when propagation gives them one sharding. The
    # pass runs before propagation and takes them to (as on every step measured); off, each reader
    # keeps its copy (a loop whose two readers want different shardings, measured too).
    merge_broadcasts: bool = True

    def run(self, module: HloModule) -> Rewrite:
        if not any(i.opcode == "while" for c in module.computations for i in c):
            return Rewrite(module)
        imported = ImportedModule(_normalized(module))
        split = ConstantSplit(imported, self.merge_broadcasts)
        find_captures(imported, split)
        if not any(loop.dropped or loop.captures for loop in imported.loops.values()):
            return Rewrite(module)
        return Rebuild(imported, split).run()


def _normalized(module: HloModule) -> HloModule:
    """Every While starts from a `tuple` of its own and its body returns a `tuple`, the form XLA's
    exporter writes: elements are then operands to drop and append."""
    edit = ModuleEdit(module)
    for comp in list(edit.computations.values()):
        for inst in list(comp):
            if inst.opcode != "while":
                continue
            cond, body = edit[inst.attr("condition").names[0]], edit[inst.attr("body").names[0]]
            tuples = (inst, comp[inst.operands[0]], cond.parameters[0], body.parameters[0], body.root)
            if any(_sharded(t) for t in tuples):
                raise UnsupportedHlo(f"{inst.name} or its tuples carry a sharding before propagation")
            init = comp[inst.operands[0]]
            if init.opcode != "tuple" or len(comp.users(init.name)) > 1:
                comp.set_operands(inst.name, (_as_tuple(edit, comp, init, before=inst.name),))
            if body.root.opcode != "tuple":
                body.root_name = _as_tuple(edit, body, body.root, before=None)
    return edit.freeze()


def _sharded(inst: Instruction) -> bool:
    """A sharding written on it, in HLO's spelling or Shardy's (the element list would no longer fit)."""
    attributes = inst.attr("frontend_attributes")
    shardy = isinstance(attributes, FrontendAttributes) and attributes.get("xla.sdy.sharding") is not None
    return inst.sharding is not None or shardy


def _as_tuple(edit: ModuleEdit, comp: ComputationEdit, value: Instruction, before: str | None) -> str:
    shape = value.shape
    assert isinstance(shape, TupleShape)
    parts = []
    for k in range(len(shape.elements)):
        if value.opcode == "tuple":
            parts.append(value.operands[k])
            continue
        gte = get_tuple_element(edit.fresh_name("get-tuple-element"), value.name, shape, k)
        parts.append(comp.add(gte, before=before).name)
    return comp.add(tuple_of(edit.fresh_name("tuple"), tuple(parts), shape.elements), before=before).name


__all__ = ["ShardyRoundTrip"]

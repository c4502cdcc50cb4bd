"""The cross-entropy gradient's scatter, rewritten as XLA:TPU's `sparse-gradient-rewrite` rewrites it.

libtpu's pass (closed source; modelled on its before/after in a dump of an LM step, see the README's
table of passes) turns a scatter that adds one value per row of a batch at one index of one
dimension (JAX's gradient of `take_along_axis(log_probs, labels)`) into a one-hot select:

    scatter(zeros[B,S,V], labels[B,S,1], g[B,S,1]), inserted_window_dims={2},
            input_batching_dims={0,1}, scatter_indices_batching_dims={0,1}, to_apply=add
  becomes
    hit = compare(broadcast(reshape(labels -> [B,S]), dims={0,1}), iota[B,S,V] over dim 2), EQ
    select(hit, add(zeros, broadcast(reshape(g -> [B,S]), dims={0,1})), zeros)

What changes for propagation: a scatter's result follows its operand and updates by GSPMD's
scatter rules; the select is elementwise, so the gradient of the logits takes the sharding of the
compare, which follows the labels' batch split. The embedding's gradient (a scatter with no batch
dims) is left alone, as libtpu leaves it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from planner.hlo.ir.module import Attribute, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.prepare.edit import ComputationEdit, ModuleEdit
from planner.prepare.rewrite import Rewrite


@dataclass(frozen=True)
class SparseGradientRewrite:
    NAME: ClassVar[str] = "sparse-gradient-rewrite"
    MIRRORS: ClassVar[str] = "libtpu's sparse-gradient-rewrite, observed before/after on an LM step's dump"

    def run(self, module: HloModule) -> Rewrite:
        edit = ModuleEdit(module)
        renamed: dict[str, str] = {}
        for comp in edit.computations.values():
            for inst in comp:
                if inst.opcode == "scatter" and (dim := _one_hot_dim(comp, edit, inst)) is not None:
                    renamed[inst.name] = _rewrite(comp, edit, inst, dim)
        if not renamed:
            return Rewrite(module)
        return Rewrite(edit.freeze(), renamed, f"{len(renamed)} one-index-per-row scatters rewritten as selects")


def _dims(inst: Instruction, key: str) -> tuple[int, ...]:
    value = inst.attr(key)
    return tuple(value) if value is not None else ()


def _one_hot_dim(comp: ComputationEdit, edit: ModuleEdit, scatter: Instruction) -> int | None:
    """The scattered dim when the scatter adds one value per batch row at one index of that dim."""
    if len(scatter.operands) != 3 or not isinstance(scatter.shape, ArrayShape):
        return None
    _, indices, updates = (comp[o] for o in scatter.operands)
    shape = scatter.shape
    inserted = _dims(scatter, "inserted_window_dims")
    if (
        _dims(scatter, "update_window_dims")
        or len(inserted) != 1
        or _dims(scatter, "scatter_dims_to_operand_dims") != inserted
    ):
        return None
    dim = inserted[0]
    batch = tuple(d for d in range(shape.rank) if d != dim)
    if _dims(scatter, "input_batching_dims") != batch or _dims(scatter, "scatter_indices_batching_dims") != batch:
        return None
    rows = math.prod(shape.dims[d] for d in batch)
    for value in (indices, updates):
        if not isinstance(value.shape, ArrayShape) or value.shape.num_elements != rows:
            return None
    return dim if _adds(edit, scatter) else None


def _adds(edit: ModuleEdit, scatter: Instruction) -> bool:
    """Whether the scatter's combiner is `add(param 0, param 1)`."""
    to_apply = scatter.attr("to_apply")
    if to_apply is None:
        return False
    combiner = edit[to_apply.names[0]]
    root = combiner.root
    params = {p.name for p in combiner.parameters}
    return root.opcode == "add" and set(root.operands) == params and len(params) == 2


def _rewrite(comp: ComputationEdit, edit: ModuleEdit, scatter: Instruction, dim: int) -> str:
    operand, indices, updates = (comp[o] for o in scatter.operands)
    shape = scatter.shape
    assert isinstance(shape, ArrayShape)
    batch = tuple(d for d in range(shape.rank) if d != dim)
    rows = tuple(shape.dims[d] for d in batch)

    def add(opcode: str, result: ArrayShape, operands: tuple[str, ...], **attrs: object) -> str:
        name = edit.fresh_name(opcode)
        attributes = tuple(Attribute(k, v, _text(v)) for k, v in attrs.items())
        comp.add(Instruction(name, opcode, result, operands, attributes), before=scatter.name)
        return name

    index_type = indices.shape.leaves()[0].element_type
    label = add("reshape", ArrayShape(index_type, rows), (indices.name,))
    labels = add("broadcast", ArrayShape(index_type, shape.dims), (label,), dimensions=batch)
    positions = add("iota", ArrayShape(index_type, shape.dims), (), iota_dimension=dim)
    hit = add("compare", ArrayShape("pred", shape.dims), (labels, positions), direction="EQ")
    value = add("reshape", ArrayShape(shape.element_type, rows), (updates.name,))
    spread = add("broadcast", ArrayShape(shape.element_type, shape.dims), (value,), dimensions=batch)
    summed = add("add", shape, (operand.name, spread))
    result = add("select", shape, (hit, summed, operand.name))
    comp.replace_uses(scatter.name, result)
    comp.remove(scatter.name)
    return result


def _text(value: object) -> str:
    if isinstance(value, tuple):
        return "{" + ",".join(str(v) for v in value) + "}"
    return str(value)

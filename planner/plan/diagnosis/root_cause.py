"""Root cause: the op where a mesh axis disappears on the way to an under-sharded buffer.

The provenance chain of the buffer leads back to the annotation its sharding
came from. Walking it forward from that annotation, the first op whose result
is split over fewer devices than the value it was derived from is where the
axis was dropped; for the stacked-gradient blow-up it is the weight-gradient
dot that contracts the dim the mesh axis was on. It is shown as

    transpose.1659[1024_tp, 256_fsdp] . multiply.1658[256_fsdp, 4096_tp] -> dot.1660[1024_tp, 4096]

where `size_axis` names the mesh axes a dim is split over (`size_a*b` for
several) and a bare size is not split: fsdp, on the contracted dim, is gone.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.hlo.ir.debug_info import source_location
from planner.hlo.ir.module import HloModule
from planner.hlo.ir.shapes import ArrayShape
from planner.mesh import Mesh
from planner.plan.diagnosis.split_picture import TensorSplit, dim_axes, tensor_split
from planner.propagation import PropagationResult
from planner.sharding.hlo_sharding import HloSharding


@dataclass(frozen=True)
class RootCause:
    instruction: str
    opcode: str
    source: str | None
    notation: str
    tiles_before: int
    tiles_after: int
    dropped_axes: tuple[str, ...]
    # The op drawn: its array operands and its result, each dim with the mesh axes it is split over.
    operands: tuple[TensorSplit, ...] = ()
    result: TensorSplit | None = None


def _label(name: str, shape: ArrayShape, sharding: HloSharding | None, mesh: Mesh) -> str:
    axes = dim_axes(sharding, shape.rank, mesh)
    dims = [f"{n}_{'*'.join(a)}" if a else str(n) for n, a in zip(shape.dims, axes)]
    return f"{name}[{', '.join(dims)}]"


def _mesh_axes(sharding: HloSharding | None, rank: int, mesh: Mesh) -> set[str]:
    return {a for axes in dim_axes(sharding, rank, mesh) for a in axes}


def root_cause(module: HloModule, result: PropagationResult, name: str, mesh: Mesh) -> RootCause | None:
    chain = result.explain(name)
    for k in range(len(chain) - 1, 0, -1):
        source, step = chain[k], chain[k - 1]
        before, after = source.sharding, step.sharding
        if before is None or after is None or before.is_tuple or after.is_tuple:
            continue
        if after.num_tiles >= before.num_tiles:
            continue
        inst = module.instruction(step.instruction.name) if _known(module, step.instruction.name) else None
        if inst is None or not isinstance(inst.shape, ArrayShape):
            continue
        operands = [module.instruction(o) for o in inst.operands if _known(module, o)]
        arrays = [o for o in operands if isinstance(o.shape, ArrayShape) and o.shape.rank > 0]
        shardings = [result.sharding(o.name) if o.name in result else None for o in arrays]
        shown = [_label(o.name, o.shape, s, mesh) for o, s in zip(arrays, shardings)]  # type: ignore[arg-type]
        drawn = tuple(tensor_split(o.name, o.shape.dims, s, mesh) for o, s in zip(arrays, shardings))  # type: ignore[union-attr]
        sep = " . " if inst.opcode in ("dot", "convolution") else ", "
        notation = f"{sep.join(shown)} -> {_label(inst.name, inst.shape, after, mesh)}"
        source_shape = _shape_of(module, source.instruction.name)
        lost = (
            _mesh_axes(before, source_shape.rank, mesh) - _mesh_axes(after, inst.shape.rank, mesh)
            if source_shape
            else set()
        )
        where = source_location(module, inst)
        return RootCause(
            inst.name,
            inst.opcode,
            where,
            notation,
            before.num_tiles,
            after.num_tiles,
            tuple(sorted(lost)),
            drawn,
            tensor_split(inst.name, inst.shape.dims, after, mesh),
        )
    return None


def _known(module: HloModule, name: str) -> bool:
    try:
        module.home_of(name)
    except KeyError:
        return False
    return True


def _shape_of(module: HloModule, name: str) -> ArrayShape | None:
    if not _known(module, name):
        return None
    shape = module.instruction(name).shape
    return shape if isinstance(shape, ArrayShape) else None

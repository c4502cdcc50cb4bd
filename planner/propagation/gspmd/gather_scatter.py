"""Gather and scatter: which dims of operand, indices and output/updates correspond.

Three kinds of correspondence carry shardings (XLA's hlo_sharding_util):
- index pass-through: the indices' batch dims are the output's non-offset dims;
- operand pass-through: an operand dim sliced whole is an offset (window) dim;
- parallel dims: explicit batching dims, or an iota in the indices making
  operand dim and indices dim walk together (a "parallel" gather/scatter).
For scatter the updates play the output's role.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.propagation.shared.graph import Node
from planner.sharding import algebra
from planner.sharding.hlo_sharding import HloSharding
from planner.sharding.merge import merge_sharding


@dataclass(frozen=True)
class Dims:
    """One correspondence: operand_dims[i] ~ indices_dims[i] ~ output_dims[i]."""

    operand_dims: tuple[int, ...]
    indices_dims: tuple[int, ...]
    output_dims: tuple[int, ...]


@dataclass(frozen=True)
class Spec:
    """Gather or scatter dimension numbers in one vocabulary."""

    operand: Node
    indices: Node
    output_rank: int
    output_dims_of_window: tuple[int, ...]  # gather offset_dims / scatter update_window_dims
    collapsed: tuple[int, ...]  # collapsed_slice_dims / inserted_window_dims
    index_map: tuple[int, ...]  # start_index_map / scatter_dims_to_operand_dims
    index_vector_dim: int
    slice_sizes: tuple[int, ...]
    operand_batching: tuple[int, ...]
    indices_batching: tuple[int, ...]


def gather_spec(node: Node) -> Spec:
    a = node.inst.attr
    return Spec(
        operand=node.operands[0],
        indices=node.operands[1],
        output_rank=node.rank,
        output_dims_of_window=a("offset_dims", ()),
        collapsed=a("collapsed_slice_dims", ()),
        index_map=a("start_index_map", ()),
        index_vector_dim=a("index_vector_dim", node.operands[1].rank),
        slice_sizes=a("slice_sizes", ()),
        operand_batching=a("operand_batching_dims", ()),
        indices_batching=a("start_indices_batching_dims", ()),
    )


def scatter_spec(node: Node) -> Spec:
    a = node.inst.attr
    count = (len(node.operands) - 1) // 2
    operand, indices, update = node.operands[0], node.operands[count], node.operands[count + 1]
    window = a("update_window_dims", ())
    inserted = a("inserted_window_dims", ())
    batching = a("input_batching_dims", ())
    sizes, k = [], 0
    for d in range(operand.rank):
        if d in inserted or d in batching:
            sizes.append(1)
        else:
            sizes.append(update.dims[window[k]])
            k += 1
    return Spec(
        operand=operand,
        indices=indices,
        output_rank=update.rank,
        output_dims_of_window=window,
        collapsed=inserted,
        index_map=a("scatter_dims_to_operand_dims", ()),
        index_vector_dim=a("index_vector_dim", indices.rank),
        slice_sizes=tuple(sizes),
        operand_batching=batching,
        indices_batching=a("scatter_indices_batching_dims", ()),
    )


def _index_to_output(spec: Spec, indices_dims: tuple[int, ...]) -> tuple[int, ...]:
    """Output dims paired with indices dims: non-window output dims, in order."""
    batch_output = [d for d in range(spec.output_rank) if d not in spec.output_dims_of_window]
    batch_indices = [d for d in range(spec.indices.rank) if d != spec.index_vector_dim]
    pairing = dict(zip(batch_indices, batch_output))
    return tuple(pairing[d] for d in indices_dims)


def index_passthrough(spec: Spec) -> Dims:
    batch_output = [d for d in range(spec.output_rank) if d not in spec.output_dims_of_window]
    batch_indices = [d for d in range(spec.indices.rank) if d != spec.index_vector_dim]
    n = min(len(batch_output), len(batch_indices))
    return Dims((), tuple(batch_indices[:n]), tuple(batch_output[:n]))


def operand_passthrough(spec: Spec) -> Dims:
    operand_dims, output_dims = [], []
    skipped = 0
    for i in range(spec.operand.rank):
        if i in spec.collapsed or i in spec.operand_batching:
            skipped += 1
            continue
        if i < len(spec.slice_sizes) and spec.slice_sizes[i] == spec.operand.dims[i]:
            operand_dims.append(i)
            output_dims.append(spec.output_dims_of_window[i - skipped])
    return Dims(tuple(operand_dims), (), tuple(output_dims))


def explicit_parallel(spec: Spec) -> Dims | None:
    if not spec.operand_batching:
        return None
    return Dims(spec.operand_batching, spec.indices_batching, _index_to_output(spec, spec.indices_batching))


def implicit_parallel(spec: Spec) -> Dims | None:
    """GetGatherScatterBatchParallelDims: an iota in the indices ties operand and indices dims."""
    indices = spec.indices
    source = indices
    while source.opcode == "copy":
        source = source.operands[0]
    components = len(spec.index_map)
    parallel = [-1] * components
    if source.opcode == "concatenate" and source.inst.attr("dimensions", (-1,))[0] == spec.index_vector_dim:
        k = 0
        for piece in source.operands:
            n = piece.dims[spec.index_vector_dim] if spec.index_vector_dim < piece.rank else 1
            d = _iota_dim(piece)
            if d is not None and d != spec.index_vector_dim:
                for j in range(k, min(k + n, components)):
                    parallel[j] = d
            k += n
    else:
        d = _iota_dim(source)
        if d is not None and d != spec.index_vector_dim:
            parallel = [d] * components
    accepted_indices: list[int] = []
    accepted_operand: list[int] = []
    for i, d in enumerate(parallel):
        if d < 0:
            continue
        if d in accepted_indices:
            return None
        operand_dim = spec.index_map[i]
        if spec.slice_sizes[operand_dim] != 1 or d in spec.indices_batching:
            continue
        if spec.operand.dims[operand_dim] != indices.dims[d]:
            return None
        accepted_indices.append(d)
        accepted_operand.append(operand_dim)
    if not accepted_indices:
        return None
    indices_dims = tuple(accepted_indices)
    return Dims(tuple(accepted_operand), indices_dims, _index_to_output(spec, indices_dims))


def _iota_dim(node: Node) -> int | None:
    """GetDimensionForIota: the dim along which `node` counts 0, 1, 2, ..."""
    if node.opcode == "iota":
        return int(node.inst.attr("iota_dimension"))
    if not node.is_array or node.shape.element_type != "s32":  # type: ignore[union-attr]
        return None
    if node.opcode == "broadcast":
        inner = _iota_dim(node.operands[0])
        if inner is None:
            return None
        return node.inst.attr("dimensions", ())[inner]
    return None


def _along(s: HloSharding, src: tuple[int, ...], tgt: tuple[int, ...], rank: int) -> HloSharding:
    return algebra.propagate_along_dims(s, src, tgt, rank)


# -- forward --------------------------------------------------------------------


def output_from_index(spec: Spec, s: HloSharding) -> HloSharding:
    if not s.is_tiled:
        return s
    dims = index_passthrough(spec)
    return _along(s, dims.indices_dims, dims.output_dims, spec.output_rank)


def output_from_operand_passthrough(spec: Spec, s: HloSharding) -> HloSharding | None:
    if not s.is_tiled:
        return None
    dims = operand_passthrough(spec)
    out = _along(s, dims.operand_dims, dims.output_dims, spec.output_rank)
    return None if out.is_tile_maximal else out


def parallel_from(s: HloSharding, dims: tuple[int, ...], output_dims: tuple[int, ...], rank: int) -> HloSharding:
    if not s.is_tiled:
        return s
    return _along(s, dims, output_dims, rank)


# -- backward -------------------------------------------------------------------


def index_from_output(spec: Spec, s: HloSharding) -> HloSharding:
    if not s.is_tiled:
        return s
    dims = index_passthrough(spec)
    return _along(s, dims.output_dims, dims.indices_dims, spec.indices.rank)


def _parallel_dims(spec: Spec) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(operand dims, output dims) of all parallel correspondences, or None."""
    found = [d for d in (explicit_parallel(spec), implicit_parallel(spec)) if d is not None]
    if not found:
        return None
    return tuple(d for p in found for d in p.operand_dims), tuple(d for p in found for d in p.output_dims)


def _prefer_parallel(parallel: HloSharding | None, passthrough: HloSharding | None) -> HloSharding | None:
    """Combine both views; when they conflict the parallel one wins, as the partitioner prefers it."""
    if passthrough is None:
        return parallel
    if parallel is None:
        return passthrough
    merged = merge_sharding(parallel, passthrough, True)
    if merged is not None:
        return merged
    merged = merge_sharding(passthrough, parallel, True)
    return merged if merged is not None else parallel


def operand_from_output(spec: Spec, s: HloSharding) -> HloSharding | None:
    """GatherOperandShardingFromOutput: parallel and pass-through dims combined."""
    dims = _parallel_dims(spec) if s.is_tiled else None
    parallel = _along(s, dims[1], dims[0], spec.operand.rank) if dims is not None else None
    if s.is_tile_maximal or s.is_manual:
        passthrough: HloSharding | None = s
    else:
        through = operand_passthrough(spec)
        out = _along(s, through.output_dims, through.operand_dims, spec.operand.rank)
        passthrough = None if out.is_tile_maximal else out
    return _prefer_parallel(parallel, passthrough)


def operand_to_update(spec: Spec, s: HloSharding) -> HloSharding | None:
    """ScatterUpdateShardingFromOutput: the scatter output (operand-shaped) to its updates."""
    dims = _parallel_dims(spec) if s.is_tiled else None
    parallel = _along(s, dims[0], dims[1], spec.output_rank) if dims is not None else None
    passthrough = output_from_operand_passthrough(spec, s) if s.is_tiled else None
    return _prefer_parallel(parallel, passthrough)

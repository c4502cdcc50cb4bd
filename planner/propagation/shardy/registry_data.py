"""Sharding rules of data-dependent and linear-algebra ops: gather, scatter, sort, top-k, random bits, fft,
cholesky, triangular-solve.

Each entry follows its case in Shardy's `op_sharding_rule_registry.cc`, adding factors in the same
order: aggressive propagation breaks ties by factor index.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from planner.hlo.ir.module import Computation
from planner.hlo.ir.shapes import ArrayShape
from planner.propagation.shardy.registry_common import Dims, OpView
from planner.propagation.shardy.rule import NULL_DIM, FactorType, OpShardingRule

# (input dim, indices dim, slices dim, size, kind, blocked): one factor of a gather or a scatter.
_AddFactor = Callable[[int, int, int, int, FactorType, bool], object]


@dataclass(frozen=True, slots=True)
class _Kinds:
    """The factor kinds that tell a gather's rule from a scatter's, and one release's from another's."""

    is_scatter: bool
    # A slices dim taking its input dim in part: the input's factor in a scatter.
    partial_window_input: FactorType
    # An implicit batch dim of a scatter (in the indices and updates only).
    implicit_batch: FactorType
    # A collapsed input dim of size 1, in a gather.
    size_one_collapsed: FactorType


def _gather_scatter_factors(
    kinds: _Kinds,
    input_shape: Dims,
    slices_shape: Dims,
    indices_shape: Dims,
    index_vector_dim: int,
    offset_dims: Sequence[int],
    collapsed_dims: Sequence[int],
    input_batching_dims: Sequence[int],
    indices_batching_dims: Sequence[int],
    add: _AddFactor,
) -> None:
    """The factors of a gather (slices = its result) or a scatter (slices = its updates), in Shardy's order
    (`addGatherScatterFactors`).

    Walking the slices' dims: an offset dim pairs with the next input dim that is neither collapsed nor a
    batching dim. Taken whole it shares one factor with it. Taken in part it cannot: a scatter gives the
    input dim a factor of its own (`kinds.partial_window_input`) and the slices dim a need-replication
    one; a gather of one element keeps the input dim sharded by reducing the result (each device
    contributes its own part, zeros elsewhere); a gather of a larger window blocks the dim. Any other
    slices dim is a batch dim of the indices, shared with the input too when it is an explicit batching
    dim; in a scatter an implicit one is `kinds.implicit_batch` (a reduction when updates from every
    device may be combined on the same input). Then one factor per collapsed input dim (for a gather a
    reduction by the same one-element argument, or `kinds.size_one_collapsed` for a dim of one
    element), and one for the indices' index-vector dim, which needs replication.
    """
    input_dim = 0
    batch_position = 0
    for slices_dim, slices_size in enumerate(slices_shape):
        if slices_dim in offset_dims:
            while input_dim in collapsed_dims or input_dim in input_batching_dims:
                input_dim += 1
            input_size = input_shape[input_dim]
            if input_size == slices_size:
                add(input_dim, NULL_DIM, slices_dim, input_size, FactorType.PASS_THROUGH, False)
            elif kinds.is_scatter:
                add(input_dim, NULL_DIM, NULL_DIM, input_size, kinds.partial_window_input, False)
                add(NULL_DIM, NULL_DIM, slices_dim, slices_size, FactorType.NEED_REPLICATION, False)
            elif slices_size == 1:
                add(input_dim, NULL_DIM, NULL_DIM, input_size, FactorType.REDUCTION, False)
                add(NULL_DIM, NULL_DIM, slices_dim, slices_size, FactorType.NEED_REPLICATION, False)
            else:
                add(input_dim, NULL_DIM, slices_dim, input_size, FactorType.NEED_REPLICATION, True)
            input_dim += 1
        else:
            indices_dim = batch_position if batch_position < index_vector_dim else batch_position + 1
            explicit = indices_dim in indices_batching_dims
            input_batch_dim = (
                input_batching_dims[list(indices_batching_dims).index(indices_dim)] if explicit else NULL_DIM
            )
            kind = kinds.implicit_batch if kinds.is_scatter and not explicit else FactorType.PASS_THROUGH
            add(input_batch_dim, indices_dim, slices_dim, slices_size, kind, False)
            batch_position += 1
    for collapsed in collapsed_dims:
        size = input_shape[collapsed]
        if kinds.is_scatter:
            kind = FactorType.PASS_THROUGH
        else:
            kind = kinds.size_one_collapsed if size == 1 else FactorType.REDUCTION
        add(collapsed, NULL_DIM, NULL_DIM, size, kind, False)
    if index_vector_dim < len(indices_shape):
        size = indices_shape[index_vector_dim]
        add(NULL_DIM, index_vector_dim, NULL_DIM, size, FactorType.NEED_REPLICATION, False)


def gather(op: OpView) -> OpShardingRule:
    operand, indices = op.operands
    size_one_collapsed = op.release.traits.gather_size_one_collapsed
    kinds = _Kinds(False, FactorType.PASS_THROUGH, FactorType.PASS_THROUGH, size_one_collapsed)
    builder = op.builder()
    _gather_scatter_factors(
        kinds,
        operand,
        op.results[0],
        indices,
        op.attr_int("index_vector_dim", len(indices)),
        op.attr_dims("offset_dims"),
        op.attr_dims("collapsed_slice_dims"),
        op.attr_dims("operand_batching_dims"),
        op.attr_dims("start_indices_batching_dims"),
        lambda i, idx, s, size, kind, blocked: builder.add_factor([i, idx], [s], size, kind, blocked),
    )
    return builder.build()


def scatter(op: OpView) -> OpShardingRule:
    """Operands are the inputs, the indices, then as many updates; each input's dims map to its result's."""
    num_inputs = len(op.results)
    indices = op.operands[num_inputs]
    traits = op.release.traits
    reduces = not traits.scatter_checks_reducer or _combines_across_devices(op.called("to_apply"), num_inputs)
    implicit_batch = FactorType.REDUCTION if reduces else FactorType.NEED_REPLICATION
    kinds = _Kinds(True, traits.scatter_partial_window_input, implicit_batch, FactorType.PASS_THROUGH)
    builder = op.builder()
    _gather_scatter_factors(
        kinds,
        op.operands[0],
        op.operands[num_inputs + 1],
        indices,
        op.attr_int("index_vector_dim", len(indices)),
        op.attr_dims("update_window_dims"),
        op.attr_dims("inserted_window_dims"),
        op.attr_dims("input_batching_dims"),
        op.attr_dims("scatter_indices_batching_dims"),
        lambda i, idx, s, size, kind, blocked: builder.add_factor(
            [i] * num_inputs + [idx] + [s] * num_inputs, [i] * num_inputs, size, kind, blocked
        ),
    )
    return builder.build()


# Ops whose partial results devices may combine in any order (Shardy's `getCommonSupportedReductionOp`);
# `and` and `or` only over booleans.
_REDUCERS = frozenset({"add", "multiply", "maximum", "minimum"})
_BOOLEAN_REDUCERS = frozenset({"and", "or"})


def _combines_across_devices(update: Computation | None, num_inputs: int) -> bool:
    """Whether a scatter's update computation is one reduction Shardy knows, so updates that land on one
    input from every device may be summed up (or maxed, ...) after the scatter.

    Each of the `num_inputs` results must be the same associative, commutative binary op over its own
    current value and update (parameters i and i + num_inputs, either order). An update computation not
    at hand (no module given) is taken to be one: JAX's scatters (`.at[].add`, embedding gradients) are.
    """
    if update is None:
        return True
    root = update.root
    returned = update.operands(root) if root.opcode == "tuple" else (root,)
    if len(update.parameters) != 2 * num_inputs or len(returned) != num_inputs:
        return False
    if len({inst.opcode for inst in returned}) != 1:
        return False
    for index, inst in enumerate(returned):
        boolean = isinstance(inst.shape, ArrayShape) and inst.shape.element_type == "pred"
        if inst.opcode not in _REDUCERS and not (boolean and inst.opcode in _BOOLEAN_REDUCERS):
            return False
        numbers = sorted(-1 if a.parameter_number is None else a.parameter_number for a in update.operands(inst))
        if numbers != [index, index + num_inputs]:
            return False
    return True


def sort(op: OpView) -> OpShardingRule:
    """Batch dims are shared; the sorted dim needs replication.

    It is also blocked when it is the only dim larger than 1: with no batch dim to shard, a sharding
    propagated along it could only be undone by gathering the tensor again before the sort.
    """
    (sort_dim,) = op.attr_dims("dimensions")
    shape = op.operands[0]
    blocked = all(dim == sort_dim or size == 1 for dim, size in enumerate(shape))
    builder = op.builder()
    for dim, size in enumerate(shape):
        if dim == sort_dim:
            builder.add_factor_same_dim(dim, size, FactorType.NEED_REPLICATION, blocked)
        else:
            builder.add_factor_same_dim(dim, size)
    return builder.build()


def top_k(op: OpView) -> OpShardingRule:
    """`mhlo.topk` (HLO `topk`): values and indices share the batch dims; the reduced dim needs replication and
    is blocked."""
    return (
        op.builder()
        .add_pointwise_with_mismatch(op.operands[0], op.results[0], FactorType.NEED_REPLICATION, True)
        .build()
    )


def rng_bit_generator(op: OpView) -> OpShardingRule | None:
    """The initial and new states must stay replicated, with nothing propagated between them; the random
    output's dims are free (its own factors)."""
    if len(op.results) != 2:
        return None
    builder = op.builder()
    for dim, size in enumerate(op.operands[0]):
        builder.add_factor([dim], [dim, NULL_DIM], size, FactorType.NEED_REPLICATION, True)
    for dim, size in enumerate(op.results[1]):
        builder.add_factor([NULL_DIM], [NULL_DIM, dim], size)
    return builder.build()


def fft(op: OpView) -> OpShardingRule:
    """Leading dims are batch dims; the transformed ones need replication, and the last one is also blocked
    when a real transform changes its size (rfft truncates, irfft expands)."""
    (in_shape,), (out_shape,) = op.operands, op.results
    num_fft_dims = len(op.attr_dims("fft_length"))
    rank = len(in_shape)
    builder = op.builder()
    for dim, size in enumerate(in_shape):
        if dim < rank - num_fft_dims:
            builder.add_factor_same_dim(dim, size)
        elif dim < rank - 1:
            builder.add_factor_same_dim(dim, size, FactorType.NEED_REPLICATION)
        else:
            builder.add_factor_same_dim(dim, size, FactorType.NEED_REPLICATION, in_shape[-1] != out_shape[-1])
    return builder.build()


def cholesky(op: OpView) -> OpShardingRule:
    """All but the last two dims are batch dims; the two decomposed ones need replication."""
    shape = op.operands[0]
    num_batch_dims = len(shape) - 2
    return (
        op.builder()
        .add_pointwise(
            shape, lambda dim: FactorType.PASS_THROUGH if dim < num_batch_dims else FactorType.NEED_REPLICATION
        )
        .build()
    )


def triangular_solve(op: OpView) -> OpShardingRule:
    """Batch dims, then the solve's three dims, each needing replication.

    Left side solves `op(a) @ result = b`, right side `result @ op(a) = b`, where `op(a)` is `a` or its
    transpose (`transpose_a=TRANSPOSE` or `ADJOINT`): a's non-contracting dim pairs with one dim of b, the
    result's other dim with b's, and a's contracting dim with the result's remaining one.
    """
    a_shape, b_shape = op.operands
    dim1, dim2 = len(a_shape) - 2, len(a_shape) - 1
    transposed = op.word("transpose_a", "NO_TRANSPOSE") in ("TRANSPOSE", "ADJOINT")
    builder = op.builder().add_pointwise(a_shape[:-2])
    need = FactorType.NEED_REPLICATION
    if op.flag("left_side"):
        a_free, a_contracting = (dim2, dim1) if transposed else (dim1, dim2)
        builder.add_factor([a_free, dim1], [NULL_DIM], a_shape[a_free], need)
        builder.add_factor([NULL_DIM, dim2], [dim2], b_shape[dim2], need)
        builder.add_factor([a_contracting, NULL_DIM], [dim1], a_shape[a_contracting], need)
    else:
        a_free, a_contracting = (dim1, dim2) if transposed else (dim2, dim1)
        builder.add_factor([NULL_DIM, dim1], [dim1], b_shape[dim1], need)
        builder.add_factor([a_free, dim2], [NULL_DIM], a_shape[a_free], need)
        builder.add_factor([a_contracting, NULL_DIM], [dim2], a_shape[a_contracting], need)
    return builder.build()

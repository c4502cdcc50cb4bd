"""A reduce of a reshape, reduced before the reshape, as XLA:TPU's `tpu-reduce-rewriter` does.

libtpu's pass (closed source; modelled on its before/after in the dump of a GPT-2 step) applies
the second reduce-of-reshape case of XLA's `AlgebraicSimplifierVisitor::HandleReduce`
(xla/service/algebraic_simplifier.cc) without that case's one-user condition: when every reduced
dim is one the reshape leaves unmodified (`ShapeUtil::DimensionsUnmodifiedByReshape`), the reduce
reads the reshape's operand and the reshape moves after it:

    r = bf16[8,512,2304] reshape(a: bf16[8,512,3,8,96])      (also read by two dots)
    s = bf16[2304] reduce(r), dimensions={0,1}
  becomes
    s' = bf16[3,8,96] reduce(a), dimensions={0,1}
    s  = bf16[2304] reshape(s')

(algsimp leaves that reduce alone because the reshape has three users; the second
`tpu-reduce-rewriter` of `simplification-1` rewrites it.) What changes for propagation: the reduce
now keeps the operand's split of the head dim (8 of [3,8,96]), which the reshape to 2304 cannot
express, so the bias gradient a scan accumulates from it stays replicated instead of taking the
merged dim's split from the reshape.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from planner.hlo.ir.module import Attribute, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.prepare.edit import ComputationEdit, ModuleEdit
from planner.prepare.rewrite import Rewrite


def common_factors(a: Sequence[int], b: Sequence[int]) -> list[tuple[int, int]]:
    """XLA's `CommonFactors` (xla/util.cc): bounds of the groups of dims of `a` and `b` with equal products."""
    a, b = list(a), list(b)
    if a == b:
        return [(i, i) for i in range(len(a) + 1)]
    bounds: list[tuple[int, int]] = []
    i = j = 0
    prior_i = prior_j = -1
    while i < len(a) and j < len(b) and a[i] == b[j]:
        prior_i, prior_j = i, j
        bounds.append((i, j))
        i += 1
        j += 1
    rest_a, rest_b = _product(a[i:]), _product(b[j:])
    if rest_a != rest_b:
        return [(0, 0), (len(a), len(b))]
    if rest_a == 0:
        return [*bounds, (i, j), (len(a), len(b))]
    partial_a = partial_b = 1
    while True:
        if partial_a == partial_b and (i > prior_i or j > prior_j):
            prior_i, prior_j = i, j
            bounds.append((i, j))
            continue
        in_i, in_j = i < len(a), j < len(b)
        if not (in_i or in_j):
            break
        next_a = partial_a < partial_b or (in_i and (not in_j or (partial_a == partial_b and a[i] <= b[j])))
        next_b = partial_b < partial_a or (in_j and (not in_i or (partial_b == partial_a and b[j] <= a[i])))
        if next_a:
            partial_a *= a[i]
            i += 1
        if next_b:
            partial_b *= b[j]
            j += 1
    return bounds


def _product(dims: Sequence[int]) -> int:
    p = 1
    for d in dims:
        p *= d
    return p


def dimensions_unmodified_by_reshape(source: Sequence[int], target: Sequence[int]) -> list[tuple[int, int]]:
    """`ShapeUtil::DimensionsUnmodifiedByReshape`: (source dim, target dim) pairs the reshape keeps as they are."""
    factors = common_factors(source, target)
    kept = [(x, y) for (x, y), (nx, ny) in itertools.pairwise(factors) if nx - x == 1 and ny - y == 1]
    return kept


@dataclass(frozen=True)
class TpuReduceRewriter:
    NAME: ClassVar[str] = "tpu-reduce-rewriter"
    MIRRORS: ClassVar[str] = (
        "libtpu's tpu-reduce-rewriter, observed before/after on a GPT-2 step's dump "
        "(xla/service/algebraic_simplifier.cc HandleReduce, reduce-of-reshape case 2, for any number of users)"
    )

    def run(self, module: HloModule) -> Rewrite:
        edit = ModuleEdit(module)
        renamed: dict[str, str] = {}
        moved = 0
        for comp in edit.computations.values():
            for inst in comp:
                if inst.opcode == "reduce" and inst.name in comp and _rewrite(comp, edit, inst, renamed):
                    moved += 1
        if not moved:
            return Rewrite(module)
        return Rewrite(edit.freeze(), renamed, f"{moved} reduces of reshapes reduced before the reshape")


def _rewrite(comp: ComputationEdit, edit: ModuleEdit, reduce: Instruction, renamed: dict[str, str]) -> bool:
    if len(reduce.operands) != 2 or not isinstance(reduce.shape, ArrayShape) or reduce.sharding is not None:
        return False
    arg = comp[reduce.operands[0]]
    if arg.opcode != "reshape" or arg.sharding is not None:
        return False
    source = comp[arg.operands[0]]
    if not isinstance(source.shape, ArrayShape) or not isinstance(arg.shape, ArrayShape):
        return False
    dims = tuple(reduce.attr("dimensions") or ())
    unmodified = dimensions_unmodified_by_reshape(source.shape.dims, arg.shape.dims)
    by_output = {out: inp for inp, out in unmodified}
    if not dims or not all(d in by_output for d in dims):
        return False
    new_dims = tuple(by_output[d] for d in dims)
    kept = tuple(d for k, d in enumerate(source.shape.dims) if k not in new_dims)
    reduced_shape = ArrayShape(reduce.shape.element_type, kept)
    if reduced_shape.dims == reduce.shape.dims:
        return False  # the reshape only touched reduced dims: nothing moves after the reduce
    text = "{" + ",".join(str(d) for d in new_dims) + "}"
    attrs = tuple(Attribute("dimensions", new_dims, text) if a.key == "dimensions" else a for a in reduce.attributes)
    new_reduce = dataclasses.replace(
        reduce, name=edit.fresh_name("reduce"), shape=reduced_shape, operands=(source.name, reduce.operands[1]),
        attributes=attrs,
    )  # fmt: skip
    comp.add(new_reduce, before=reduce.name)
    reshape = Instruction(edit.fresh_name("reshape"), "reshape", reduce.shape, (new_reduce.name,),
                          tuple(a for a in reduce.attributes if a.key == "metadata"))  # fmt: skip
    comp.add(reshape, before=reduce.name)
    comp.replace_uses(reduce.name, reshape.name)
    comp.remove(reduce.name)
    renamed[reduce.name] = reshape.name
    if not comp.users(arg.name) and arg.name != comp.root_name:
        comp.remove(arg.name)
    return True

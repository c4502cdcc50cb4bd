"""An op's sharding rule: how each tensor dim of its operands and results maps onto shared factors.

Shardy describes every op it propagates through by one einsum-like rule over *factors*. A dot
`f32[8,32] x f32[32,16] -> f32[8,16]` is `([i, k], [k, j]) -> ([i, j]) {i=8, j=16, k=32} reduction={k}`:
factor i is the lhs's dim 0 and the result's dim 0, j the rhs's dim 1 and the result's dim 1, k the
contracting pair, which no result holds. Propagating along an op moves mesh axes between tensors
through the factors they share (`projection.py`), never through dims directly.

A dim may hold several factors, major to minor (a reshape `f32[4,8] -> f32[32]` is
`([i, j]) -> ([ij]) {i=4, j=8}`), and a dim with no factor gets one of size 1 when the rule is built,
so every dim names at least one. A factor has a kind: pass-through (the default), reduction (in operands
only; sharding it leaves partial results), need-replication (a sort dim, a dynamic-slice window) or
permutation (pad, concatenate, reverse); any factor may be blocked (nothing propagates along it).

The text is Shardy's own (`#sdy.op_sharding_rule<...>`, factor symbols i..z then z_1, z_2, ...), so a
rule reads side by side with `sdy-populate-op-sharding-rules`' output.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Shardy's kStartAtZ: factors 0..17 print as 'i'..'z', later ones as z_1, z_2, ...
_START_AT_Z = ord("z") - ord("i")
# A dim of a tensor the factor does not map to (`kNullDim`).
NULL_DIM = -1


class FactorType(enum.Enum):
    PASS_THROUGH = "pass_through"
    REDUCTION = "reduction"
    NEED_REPLICATION = "need_replication"
    PERMUTATION = "permutation"


def factor_symbol(index: int) -> str:
    return chr(ord("i") + index) if index <= _START_AT_Z else f"z_{index - _START_AT_Z}"


# Per tensor, per dim: the factors the dim is made of, major to minor.
TensorMapping = tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class OpShardingRule:
    factor_sizes: tuple[int, ...]
    operand_mappings: tuple[TensorMapping, ...]
    result_mappings: tuple[TensorMapping, ...]
    reduction_factors: tuple[int, ...] = ()
    need_replication_factors: tuple[int, ...] = ()
    permutation_factors: tuple[int, ...] = ()
    blocked_factors: tuple[int, ...] = ()
    is_custom: bool = False

    def __post_init__(self) -> None:
        num_factors = len(self.factor_sizes)
        for mapping in (*self.operand_mappings, *self.result_mappings):
            for dim in mapping:
                if not dim or any(not 0 <= f < num_factors for f in dim):
                    raise ValueError(f"dim mapping {dim} must name factors in 0..{num_factors - 1}")

    @property
    def num_factors(self) -> int:
        return len(self.factor_sizes)

    @property
    def mappings(self) -> tuple[TensorMapping, ...]:
        """Operands' then results' mappings: tensor index i < num_operands is operand i."""
        return self.operand_mappings + self.result_mappings

    def factor_type(self, factor: int) -> FactorType:
        if factor in self.reduction_factors:
            return FactorType.REDUCTION
        if factor in self.need_replication_factors:
            return FactorType.NEED_REPLICATION
        if factor in self.permutation_factors:
            return FactorType.PERMUTATION
        return FactorType.PASS_THROUGH

    def is_blocked(self, factor: int) -> bool:
        return factor in self.blocked_factors

    def to_text(self) -> str:
        def tensor(mapping: TensorMapping) -> str:
            return "[" + ", ".join("".join(factor_symbol(f) for f in dim) for dim in mapping) + "]"

        text = "#sdy.op_sharding_rule<("
        text += ", ".join(tensor(m) for m in self.operand_mappings) + ")->("
        text += ", ".join(tensor(m) for m in self.result_mappings) + ")"
        if self.factor_sizes:
            text += " {" + ", ".join(f"{factor_symbol(i)}={s}" for i, s in enumerate(self.factor_sizes)) + "}"
        for word, factors in (
            ("reduction", self.reduction_factors),
            ("need_replication", self.need_replication_factors),
            ("permutation", self.permutation_factors),
            ("blocked_propagation", self.blocked_factors),
        ):
            if factors:
                text += f" {word}={{{', '.join(factor_symbol(f) for f in factors)}}}"
        return text + (", custom" if self.is_custom else "") + ">"


class RuleBuilder:
    """Builds a rule factor by factor, in the order Shardy's `OpShardingRuleBuilder` adds them.

    Factor order is part of the rule: aggressive propagation breaks ties by factor index, so each
    registry entry adds its factors in the order the C++ builder call sequence does.
    """

    def __init__(self, operand_ranks: Sequence[int], result_ranks: Sequence[int]) -> None:
        self._sizes: list[int] = []
        self._operands: list[list[list[int]]] = [[[] for _ in range(r)] for r in operand_ranks]
        self._results: list[list[list[int]]] = [[[] for _ in range(r)] for r in result_ranks]
        self._kinds: dict[FactorType, list[int]] = {t: [] for t in FactorType}
        self._blocked: list[int] = []

    def _reserve(self, size: int, kind: FactorType, blocked: bool) -> int:
        index = len(self._sizes)
        self._sizes.append(size)
        if blocked:
            self._blocked.append(index)
        self._kinds[kind].append(index)
        return index

    @staticmethod
    def _map(tensors: list[list[list[int]]], dims: Sequence[int], factor: int, size: int) -> None:
        # A size-1 factor is only recorded on a dim that has no factor yet (mapDimsToFactor).
        for tensor, dim in zip(tensors, dims, strict=True):
            if dim == NULL_DIM:
                continue
            if size == 1 and tensor[dim]:
                continue
            tensor[dim].append(factor)

    @staticmethod
    def _map_all(tensors: list[list[list[int]]], dim: int, factor: int) -> None:
        for tensor in tensors:
            if tensor:  # rank 0 tensors take no factor
                tensor[dim].append(factor)

    def add_factor(
        self,
        operand_dims: Sequence[int],
        result_dims: Sequence[int],
        size: int,
        kind: FactorType = FactorType.PASS_THROUGH,
        blocked: bool = False,
    ) -> RuleBuilder:
        """A factor on `operand_dims[i]` of operand i and `result_dims[j]` of result j (NULL_DIM: none)."""
        factor = self._reserve(size, kind, blocked)
        self._map(self._operands, operand_dims, factor, size)
        self._map(self._results, result_dims, factor, size)
        return self

    def add_factor_same_dim(
        self, dim: int, size: int, kind: FactorType = FactorType.PASS_THROUGH, blocked: bool = False
    ) -> RuleBuilder:
        """A factor on dim `dim` of every operand and result of rank >= 1."""
        factor = self._reserve(size, kind, blocked)
        self._map_all(self._operands, dim, factor)
        self._map_all(self._results, dim, factor)
        return self

    def add_factor_all_operands(
        self, dim: int, size: int, kind: FactorType = FactorType.PASS_THROUGH, blocked: bool = False
    ) -> RuleBuilder:
        factor = self._reserve(size, kind, blocked)
        self._map_all(self._operands, dim, factor)
        return self

    def add_factor_all_results(
        self, dim: int, size: int, kind: FactorType = FactorType.PASS_THROUGH, blocked: bool = False
    ) -> RuleBuilder:
        factor = self._reserve(size, kind, blocked)
        self._map_all(self._results, dim, factor)
        return self

    def add_pointwise(
        self,
        shape: Sequence[int],
        kind_of: Callable[[int], FactorType] = lambda _dim: FactorType.PASS_THROUGH,
        blocked_of: Callable[[FactorType], bool] = lambda _kind: False,
    ) -> RuleBuilder:
        for dim, size in enumerate(shape):
            kind = kind_of(dim)
            self.add_factor_same_dim(dim, size, kind, blocked_of(kind))
        return self

    def add_pointwise_if(
        self,
        shape: Sequence[int],
        keep: Callable[[int], bool],
        kind_of: Callable[[int], FactorType] = lambda _dim: FactorType.PASS_THROUGH,
    ) -> RuleBuilder:
        for dim, size in enumerate(shape):
            if keep(dim):
                self.add_factor_same_dim(dim, size, kind_of(dim))
        return self

    def add_pointwise_with_mismatch(
        self,
        in_shape: Sequence[int],
        out_shape: Sequence[int],
        mismatch_kind: FactorType = FactorType.NEED_REPLICATION,
        mismatch_blocked: bool = False,
    ) -> RuleBuilder:
        """Pointwise, except a dim whose size differs between `in_shape` and `out_shape` gets `mismatch_kind`."""
        for dim, (in_size, out_size) in enumerate(zip(in_shape, out_shape, strict=True)):
            if in_size == out_size:
                self.add_factor_same_dim(dim, in_size)
            else:
                self.add_factor_same_dim(dim, in_size, mismatch_kind, mismatch_blocked)
        return self

    def build(self, is_custom: bool = False) -> OpShardingRule:
        """The rule; a dim left without a factor gets its own factor of size 1 (operands first)."""
        sizes = list(self._sizes)

        def freeze(tensors: list[list[list[int]]]) -> tuple[TensorMapping, ...]:
            out = []
            for tensor in tensors:
                dims: list[tuple[int, ...]] = []
                for dim in tensor:
                    if not dim:
                        dims.append((len(sizes),))
                        sizes.append(1)
                    else:
                        dims.append(tuple(dim))
                out.append(tuple(dims))
            return tuple(out)

        operands = freeze(self._operands)
        results = freeze(self._results)
        return OpShardingRule(
            factor_sizes=tuple(sizes),
            operand_mappings=operands,
            result_mappings=results,
            reduction_factors=tuple(self._kinds[FactorType.REDUCTION]),
            need_replication_factors=tuple(self._kinds[FactorType.NEED_REPLICATION]),
            permutation_factors=tuple(self._kinds[FactorType.PERMUTATION]),
            blocked_factors=tuple(self._blocked),
            is_custom=is_custom,
        )


def pointwise_rule(shape: Sequence[int], num_operands: int, num_results: int = 1) -> OpShardingRule:
    """Every operand and result shares one factor per dim (`buildPointwise`, `createIdentityShardingRule`)."""
    rank = len(shape)
    return RuleBuilder([rank] * num_operands, [rank] * num_results).add_pointwise(shape).build()

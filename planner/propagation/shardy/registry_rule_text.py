"""A rule written out as Shardy's text, read back: the rule an op carries with it.

`jax.experimental.custom_partitioning` gives its custom call a rule of its own, which reaches HLO as
the frontend attribute `xla.sdy.sharding_rule="#sdy.op_sharding_rule<([i, j])->([j, i]) {i=4, j=2},
custom>"`. Shardy takes a rule already on an op before asking its registry, and so do we. The grammar
is `OpShardingRule.to_text()`'s:

    rule     := '#sdy.op_sharding_rule<' tensors '->' tensors [sizes] kind* [',' 'custom'] '>'
    tensors  := '(' [tensor (',' tensor)*] ')'
    tensor   := '[' [dim (',' dim)*] ']'          dim := symbol+  (major to minor)
    sizes    := '{' symbol '=' int (',' symbol '=' int)* '}'
    kind     := ('reduction' | 'need_replication' | 'permutation' | 'blocked_propagation') '={' symbols '}'
    symbol   := 'i'..'z' | 'z_' int               (factor 0 is i, 17 is z, 18 is z_1)
"""

from __future__ import annotations

import functools
import re

from planner.propagation.shardy.rule import OpShardingRule, TensorMapping
from planner.sharding.shardy import ShardyReader, ShardyTextError

PREFIX = "#sdy.op_sharding_rule<"
_SYMBOL = re.compile(r"z_(\d+)|([i-z])")
_INT = re.compile(r"\d+")
_KIND = re.compile(r"(reduction|need_replication|permutation|blocked_propagation)\s*=")


class _Cursor(ShardyReader):
    """Shardy's attribute reader, with factor symbols (`i`..`z`, `z_1`, ...) and sizes that are never negative."""

    def try_symbol(self) -> int | None:
        """The factor index a symbol names; no space may come inside a dim (`ij`)."""
        m = _SYMBOL.match(self.text, self.pos)
        if m is None:
            return None
        self.pos = m.end()
        return 17 + int(m.group(1)) if m.group(1) else ord(m.group(2)) - ord("i")

    def symbol(self, what: str) -> int:
        self.skip()
        index = self.try_symbol()
        if index is None:
            raise self.fail(f"expected a factor symbol {what}")
        return index

    def int(self, what: str) -> int:
        return int(self.match(_INT, what).group(0))


def parse_optional_rule(text: str) -> OpShardingRule | None:
    """The rule `text` writes, or None when it is not an `#sdy.op_sharding_rule<...>`; raises when malformed."""
    if not text.lstrip().startswith(PREFIX):
        return None
    return parse_rule(text)


def parse_rule(text: str) -> OpShardingRule:
    """Reads `#sdy.op_sharding_rule<...>`; ShardyTextError (a ValueError) with the offset where it went wrong."""
    c = _Cursor(text)
    c.expect(PREFIX, "to open a sharding rule")
    operands = _tensors(c)
    c.expect("->", "between operand and result mappings")
    results = _tensors(c)
    sizes: dict[int, int] = {}
    if c.try_literal("{"):
        while True:
            at = c.pos
            factor = c.symbol("in the factor sizes")
            if factor in sizes:
                c.pos = at
                raise c.fail("factor size given twice")
            c.expect("=", "after the factor symbol")
            sizes[factor] = c.int("a factor size")
            if c.try_literal("}"):
                break
            c.expect(",", "or '}' in the factor sizes")
    if sorted(sizes) != list(range(len(sizes))):
        raise c.fail(f"factor sizes must name factors 0..{len(sizes) - 1} without a gap")
    kinds: dict[str, tuple[int, ...]] = {}
    while True:
        c.skip()
        m = _KIND.match(c.text, c.pos)
        if m is None:
            break
        c.pos = m.end()
        kind = m.group(1)
        c.expect("{", f"to open {kind}")
        kinds[kind] = tuple(c.comma_list("}", functools.partial(c.symbol, f"in {kind}"), kind))
    is_custom = c.try_literal(",")
    if is_custom:
        c.expect("custom", "after ','")
    c.expect(">", "to close the sharding rule")
    c.end()
    try:
        return OpShardingRule(
            factor_sizes=tuple(sizes[i] for i in range(len(sizes))),
            operand_mappings=operands,
            result_mappings=results,
            reduction_factors=kinds.get("reduction", ()),
            need_replication_factors=kinds.get("need_replication", ()),
            permutation_factors=kinds.get("permutation", ()),
            blocked_factors=kinds.get("blocked_propagation", ()),
            is_custom=is_custom,
        )
    except ValueError as e:
        raise ShardyTextError(str(e), 0) from None


def _tensors(c: _Cursor) -> tuple[TensorMapping, ...]:
    c.expect("(", "to open a list of tensor mappings")
    return tuple(c.comma_list(")", lambda: _tensor(c), "the tensor mappings"))


def _tensor(c: _Cursor) -> TensorMapping:
    c.expect("[", "to open a tensor mapping")
    return tuple(c.comma_list("]", lambda: _dim(c), "a tensor mapping"))


def _dim(c: _Cursor) -> tuple[int, ...]:
    factors = [c.symbol("in a dim mapping")]
    while (more := c.try_symbol()) is not None:
        factors.append(more)
    return tuple(factors)

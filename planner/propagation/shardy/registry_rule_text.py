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

import re

from planner.propagation.shardy.rule import OpShardingRule, TensorMapping
from planner.sharding.shardy import ShardyTextError

PREFIX = "#sdy.op_sharding_rule<"
_SYMBOL = re.compile(r"z_(\d+)|([i-z])")
_INT = re.compile(r"\d+")
_KIND = re.compile(r"(reduction|need_replication|permutation|blocked_propagation)\s*=")
_SPACE = re.compile(r"\s*")


class _Cursor:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, message: str) -> ShardyTextError:
        found = self.text[self.pos : self.pos + 12]
        return ShardyTextError(f"{message}, found {found!r}" if found else f"{message}, found the end", self.pos)

    def skip(self) -> None:
        self.pos = _SPACE.match(self.text, self.pos).end()  # type: ignore[union-attr]

    def try_literal(self, literal: str) -> bool:
        self.skip()
        if self.text.startswith(literal, self.pos):
            self.pos += len(literal)
            return True
        return False

    def expect(self, literal: str, what: str) -> None:
        if not self.try_literal(literal):
            raise self.fail(f"expected '{literal}' {what}")

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
        self.skip()
        m = _INT.match(self.text, self.pos)
        if m is None:
            raise self.fail(f"expected {what}")
        self.pos = m.end()
        return int(m.group(0))


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
        c.expect("{", f"to open {m.group(1)}")
        factors: list[int] = []
        if not c.try_literal("}"):
            while True:
                factors.append(c.symbol(f"in {m.group(1)}"))
                if c.try_literal("}"):
                    break
                c.expect(",", f"or '}}' in {m.group(1)}")
        kinds[m.group(1)] = tuple(factors)
    is_custom = c.try_literal(",")
    if is_custom:
        c.expect("custom", "after ','")
    c.expect(">", "to close the sharding rule")
    c.skip()
    if c.pos != len(text):
        raise c.fail("unexpected text after the sharding rule")
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
    tensors: list[TensorMapping] = []
    if c.try_literal(")"):
        return ()
    while True:
        tensors.append(_tensor(c))
        if c.try_literal(")"):
            return tuple(tensors)
        c.expect(",", "or ')' between tensor mappings")


def _tensor(c: _Cursor) -> TensorMapping:
    c.expect("[", "to open a tensor mapping")
    dims: list[tuple[int, ...]] = []
    if c.try_literal("]"):
        return ()
    while True:
        factors = [c.symbol("in a dim mapping")]
        while (more := c.try_symbol()) is not None:
            factors.append(more)
        dims.append(tuple(factors))
        if c.try_literal("]"):
            return tuple(dims)
        c.expect(",", "or ']' between dims")

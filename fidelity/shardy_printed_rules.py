"""The sharding rule the installed jaxlib's Shardy gives each op of a module: `sdy-populate-op-sharding-rules`
run on it, each rule read off the op it is attached to, keyed by the op's location.

The lit cases name every op by a location of its own (`loc("l541c8")`, the line and column of the op in
Shardy's test file), which jaxlib's converter keeps on the HLO instructions it writes for the op
(`metadata={op_name="l541c8"}`), so a rule printed here can be compared with the one our registry gives
the instruction. Needs jaxlib (JAX's MLIR context holds the sdy dialect and its passes).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fidelity.shardy_regen import Shardy

_LOCATION = re.compile(r'loc\("(l\d+c\d+)"\)')
_RULE = "sdy.sharding_rule"


@dataclass(frozen=True)
class PrintedRule:
    op: str  # `stablehlo.add`
    rule: str  # `#sdy.op_sharding_rule<([i, j], [i, j])->([i, j]) {i=8, j=8}>`


def printed_rules(shardy: Shardy, module_text: str, conservative: bool) -> dict[str, PrintedRule]:
    """Location -> the rule Shardy attaches to the op there, for every op it gives one."""
    module = shardy.parse(module_text)
    flag = "true" if conservative else "false"
    shardy.run(module, f"builtin.module(func.func(sdy-populate-op-sharding-rules{{conservative-propagation={flag}}}))")
    rules: dict[str, PrintedRule] = {}
    for op in _operations(module.body):
        if _RULE not in op.attributes:
            continue
        found = _LOCATION.search(str(op.location))
        if found is not None:
            rules[found.group(1)] = PrintedRule(op.name, str(op.attributes[_RULE]))
    return rules


def _operations(block: Any) -> Iterator[Any]:
    for op in block.operations:
        yield op.operation
        for region in op.operation.regions:
            for inner in region.blocks:
                yield from _operations(inner)

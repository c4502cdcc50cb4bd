"""A JAX step's module as `jax.jit(f).lower(...).as_text(dialect="hlo")` prints it.

NAME.hlo is that text verbatim but for its `HloModule` line, which the runner replaces by XLA's own from
the before_optimizations dump of the compile: XLA's line adds the options jit passes beside the module
(`num_partitions`, `allow_spmd_sharding_propagation_to_output` and `..._to_parameters`). Taking them out
gives back the lowered header, which is what a user who pastes `lowered.as_text()` hands over.
"""

from __future__ import annotations

import re

# The options XLA's header adds to the lowered one: `, key=value` with a `{...}` list or a number.
COMPILE_OPTIONS = ("num_partitions", "allow_spmd_sharding_propagation_to_output",
                   "allow_spmd_sharding_propagation_to_parameters")  # fmt: skip
_OPTION = re.compile(r",\s*(" + "|".join(COMPILE_OPTIONS) + r")=(\{[^}]*\}|\d+)")


def lowered_form(text: str) -> str:
    """`text` (a NAME.hlo) with its header as JAX's lowering prints it: no compile options."""
    head, newline, rest = text.partition("\n")
    if not head.startswith("HloModule "):
        raise ValueError("the text does not start with an HloModule line")
    return _OPTION.sub("", head) + newline + rest

"""What a pre-partitioning pass is: a frozen value whose fields are its options, with one method.

    SomePass(option=...).run(module) -> Rewrite(module, renamed, summary)

A pass rewrites the module the way one of the compiler's own passes does before sharding
propagation, and says what it mirrors (`MIRRORS`): an open-source XLA pass by its source file, or a
libtpu pass by the before/after of its dump. `renamed` maps each name that disappeared to the name
that now holds its value (a call's result, a loop element's new index is not a name and is not in
it), so findings and user names written against the module as given can still be found. A pass
that runs other passes (`FixedPoint`) also says, in `made`, which of them made each instruction it
added: a placement planned on such an instruction has nothing to annotate in the module as written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from planner.hlo.ir.module import HloModule


@dataclass(frozen=True)
class Rewrite:
    """A pass's result: the module after it, the names it retired, and what it did (None: nothing)."""

    module: HloModule
    renamed: Mapping[str, str] = field(default_factory=dict)
    summary: str | None = None
    made: Mapping[str, str] = field(default_factory=dict)  # instruction name -> the inner pass that made it

    @property
    def changed(self) -> bool:
        return self.summary is not None


class ModulePass(Protocol):
    """One pass of a compiler's pipeline, as the planner models it."""

    NAME: ClassVar[str]  # the compiler's own name for the pass, as its dumps print it
    MIRRORS: ClassVar[str]  # the source file (or dump) whose behaviour it reproduces

    def run(self, module: HloModule) -> Rewrite: ...


def unchanged(module: HloModule) -> Rewrite:
    return Rewrite(module)


def made_names(before: HloModule, after: HloModule) -> set[str]:
    """The instruction names of `after` that `before` lacks: what a pass made, a name an earlier pass
    retired and this one gave a new instruction included."""
    had = {i.name for c in before.computations for i in c}
    return {i.name for c in after.computations for i in c if i.name not in had}

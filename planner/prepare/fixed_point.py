"""A sequence of passes run until none changes the module (XLA's HloPassFix over a pipeline).

XLA stops such a pipeline after 25 iterations (`HloPassFix::kIterationLimit`); XLA:TPU's
`simplification-1` reaches that limit only because two of its layout passes undo each other; the
planner models the pair by its net effect (`broadcast_rewriter`), which settles, so here the loop
passes settle in a few iterations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from planner.hlo.ir.module import HloModule
from planner.prepare.rewrite import ModulePass, Rewrite, made_names

ITERATION_LIMIT = 25


@dataclass(frozen=True)
class FixedPoint:
    """`passes`, in order, again and again while any of them changes the module."""

    NAME: ClassVar[str] = "fixed-point"
    MIRRORS: ClassVar[str] = "xla/hlo/pass/hlo_pass_fix.h"

    name: str
    passes: Sequence[ModulePass]

    def run(self, module: HloModule) -> Rewrite:
        renamed: dict[str, str] = {}
        made: dict[str, str] = {}
        done: dict[str, int] = {}
        for _ in range(ITERATION_LIMIT):
            changed = False
            for p in self.passes:
                rewrite = p.run(module)
                if not rewrite.changed:
                    continue
                made.update(rewrite.made or dict.fromkeys(made_names(module, rewrite.module), p.NAME))
                module, changed = rewrite.module, True
                renamed.update(rewrite.renamed)
                done[p.NAME] = done.get(p.NAME, 0) + 1
            if not changed:
                break
        if not done:
            return Rewrite(module)
        summary = ", ".join(f"{name} changed the module {n}x" for name, n in done.items())
        live = {i.name for c in module.computations for i in c}
        return Rewrite(module, renamed, f"{self.name}: {summary}", {n: p for n, p in made.items() if n in live})

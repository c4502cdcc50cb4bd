"""The passes every compiler runs before propagation: reading Shardy as GSPMD, call inlining, and one
computation per call site."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from planner.hlo.ir.module import HloModule
from planner.hlo.structure.flatten import flatten_call_graph
from planner.hlo.structure.inline import inline_calls, inlineable
from planner.hlo.structure.tpu_call_inliner import tpu_inlineable
from planner.hlo.text.shardy_import import SHARDY, partitioner_of, to_gspmd
from planner.prepare.rewrite import Rewrite


@dataclass(frozen=True)
class ShardyImport:
    """Shardy's attributes (`xla.sdy.*`) read as the GSPMD shardings everything after propagation reads.

    Not a pass of either compiler: XLA exports Shardy's shardings to HloSharding only after Shardy
    has propagated. A Shardy module is propagated by Shardy's rules on the module as it was
    (`PreparedModule.shardy`); this reading is the module plans, placements and memory speak of.
    """

    NAME: ClassVar[str] = "shardy-import"
    MIRRORS: ClassVar[str] = "planner.hlo.text.shardy_import (Shardy's sdy attributes in HloSharding terms)"

    def run(self, module: HloModule) -> Rewrite:
        if partitioner_of(module) != SHARDY:
            return Rewrite(module)
        converted, gone = to_gspmd(module)
        return Rewrite(converted, gone, "Shardy shardings read as GSPMD's")


@dataclass(frozen=True)
class FlattenCallGraph:
    """Every While body, condition, branch and kept call named by one call site only (`planner.hlo.structure.flatten`).

    XLA flattens before it inlines calls; here it runs after inlining, which leaves the same loops, each
    with a body of its own, while an inlined callee keeps the `name@call` names XLA's references use
    for its instructions (`planner.hlo.structure.inline`)."""

    NAME: ClassVar[str] = "flatten-call-graph"
    MIRRORS: ClassVar[str] = "xla/hlo/transforms/simplifiers/flatten_call_graph.cc"

    def run(self, module: HloModule) -> Rewrite:
        flattened = flatten_call_graph(module)
        if flattened is module:
            return Rewrite(module)
        copies = len(flattened.computations) - len(module.computations)
        return Rewrite(flattened, summary=f"{copies} computations copied for their other call sites")


@dataclass(frozen=True)
class CallInlining:
    """Every `call` inlined, as XLA's CallInliner does before either compiler propagates; for XLA:TPU
    (`keeps_shared_callees`), all but the large callees of several call sites its own first inliner keeps
    (`planner.hlo.structure.tpu_call_inliner`)."""

    NAME: ClassVar[str] = "call-inliner"
    MIRRORS: ClassVar[str] = "xla/service/call_inliner.cc; libtpu's call-inliner (measured)"

    keeps_shared_callees: bool = False

    def run(self, module: HloModule) -> Rewrite:
        which = tpu_inlineable(module) if self.keeps_shared_callees else None
        inlined = inline_calls(module, which)
        # Calls XLA:CPU's inliner would inline that XLA:TPU's keeps (shard_map bodies are kept by both).
        kept = sum(1 for comp in inlined.module.computations for inst in comp if inlineable(inst))
        if inlined.module is module and not kept:
            return Rewrite(module)
        calls = sum(1 for name in inlined.aliases if "@" not in name and name in _call_names(module))
        summary = f"{calls} calls inlined" + (f", {kept} kept as calls of shared callees" if kept else "")
        return Rewrite(inlined.module, inlined.aliases, summary)


def _call_names(module: HloModule) -> set[str]:
    return {inst.name for comp in module.computations for inst in comp if inst.opcode == "call"}

"""The module as one compiler will partition it: per-compiler pre-partitioning pipelines of pass values.

    prepared = prepare(module, target="v6e", mesh=Mesh.parse("fsdp=4,tp=2"))
    propagate(prepared); memory_report(prepared); make_plan(prepared, ...)

Propagation, memory and planning take only a `PreparedModule`: the module they see has been read as
GSPMD, had its calls inlined, its mesh resolved and checked, its loops found, and has been through
the target compiler's own passes that change what propagation decides.
"""

from planner.prepare.pipeline import (
    FRONT_PASSES,
    TARGET_PASSES,
    Preparation,
    absent_passes,
    annotate,
    prepare,
    reprepare,
)
from planner.prepare.prepared import PassRecord, PreparedModule
from planner.prepare.rewrite import ModulePass, Rewrite

__all__ = [
    "FRONT_PASSES",
    "TARGET_PASSES",
    "ModulePass",
    "PassRecord",
    "Preparation",
    "PreparedModule",
    "Rewrite",
    "absent_passes",
    "annotate",
    "prepare",
    "reprepare",
]

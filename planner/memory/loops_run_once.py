"""Loops that run once, removed after partitioning as XLA's simplification removes them.

XLA keeps a While whose body holds a side effect (`while_loop_simplifier.cc`, `TryRemoveWhileLoop`). A
shard_map's edges in a Shardy module (`xla.sdy.GlobalToLocalShape`, `xla.sdy.LocalToGlobalShape`, and in
XLA's dump its in-shardings as `Sharding` calls) are side-effecting custom calls, so a scan of one layer
holding a shard_map (DeepSeek-V2's dense layer and its MoE layer, one each) is still a loop when its
shardings are decided. The partitioner leaves none of those calls, and the simplification after it removes
the loop: its body inlined, the carried tuple read through (`TupleSimplifier`), the layer index folded
(`ConstantFolding`), and what became the same value merged (`HloCSE`). A weight the forward layer converts
and its rematerialized backward converts again is then one buffer, held from the one to the other, as
XLA:TPU holds it.

Instructions keep their names (a While body's are unique in the module), so the propagated shardings still
name them; two are merged only where they are split alike.
"""

from __future__ import annotations

from planner.hlo.ir.module import HloModule, Instruction
from planner.memory.buffers import is_sharding_annotation, sharding_of
from planner.memory.values import MANUAL_REGION_EDGES
from planner.prepare.constant_folding import ConstantFolding
from planner.prepare.cse import HloCse
from planner.prepare.dead_code import HloDce, TupleSimplifier, remove_dead_code
from planner.prepare.edit import ModuleEdit, has_side_effect
from planner.prepare.fixed_point import FixedPoint
from planner.prepare.while_simplifier import remove_trivial_loop
from planner.prepare.while_state import whiles
from planner.propagation.shared.result import PropagationResult


def gone_after_partitioning(inst: Instruction) -> bool:
    """A manual region's edge, or a sharding annotation (XLA's dump writes a shard_map's in-shardings as
    side-effecting `Sharding` calls): the partitioner leaves none of them."""
    return inst.attr("custom_call_target") in MANUAL_REGION_EDGES or is_sharding_annotation(inst)


def _side_effect_after_partitioning(inst: Instruction) -> bool:
    return has_side_effect(inst) and not gone_after_partitioning(inst)


def _kept_only_for_the_partitioner(module: HloModule, loop: Instruction) -> bool:
    """Whether the While's body and condition hold side effects, each of them one the partitioner removes."""
    held = [
        i for name in (loop.attr("body").names[0], loop.attr("condition").names[0]) for i in module.computation(name)
    ]
    return any(has_side_effect(i) for i in held) and not any(_side_effect_after_partitioning(i) for i in held)


def remove_loops_run_once(module: HloModule, result: PropagationResult) -> HloModule:
    """`module` with each While that runs once, and was kept only for what the partitioner removes, replaced by
    its body; then simplified as XLA simplifies after partitioning. `module` itself where there is none."""
    kept = {
        i.name
        for c in module.computations
        for i in c
        if i.opcode == "while" and _kept_only_for_the_partitioner(module, i)
    }
    if not kept:
        return module
    edit = ModuleEdit(module)
    removed = False
    for loop in whiles(edit):
        if loop.name in kept and loop.name in loop.parent:
            removed |= remove_trivial_loop(loop, side_effect=_side_effect_after_partitioning) is not None
    if not removed:
        return module
    remove_dead_code(edit)

    def partitioned(name: str) -> str:
        return repr(sharding_of(result, name))

    # Tuple reads, folding and merging feed each other (a merged read makes two index computations alike).
    passes = (TupleSimplifier(), ConstantFolding(), HloCse(partitioned), HloDce())
    return FixedPoint("after partitioning", passes).run(edit.freeze()).module

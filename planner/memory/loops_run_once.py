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
from planner.prepare.cse import merge_common_subexpressions
from planner.prepare.dead_code import TupleSimplifier, remove_dead_code
from planner.prepare.edit import ModuleEdit, has_side_effect
from planner.prepare.while_simplifier import remove_trivial_loop
from planner.prepare.while_state import whiles
from planner.propagation.shared.result import PropagationResult

# Tuple reads, folding and merging feed each other (a merged read makes two index computations alike);
# a few rounds reach the fixed point on the steps measured.
_ROUNDS = 8


def gone_after_partitioning(inst: Instruction) -> bool:
    """A manual region's edge, or a sharding annotation (XLA's dump writes a shard_map's in-shardings as
    side-effecting `Sharding` calls): the partitioner leaves none of them."""
    if inst.opcode != "custom-call":
        return False
    return inst.attr("custom_call_target") in MANUAL_REGION_EDGES or is_sharding_annotation(inst)


def _side_effect_after_partitioning(inst: Instruction) -> bool:
    return has_side_effect(inst) and not gone_after_partitioning(inst)


def _kept_only_for_the_partitioner(module: HloModule, loop: Instruction) -> bool:
    """Whether the While's body and condition hold side effects, each of them one the partitioner removes."""
    names = (loop.attr("body").names[0], loop.attr("condition").names[0])
    kept_for = [i for name in names for i in module.computation(name) if has_side_effect(i)]
    return bool(kept_for) and all(gone_after_partitioning(i) for i in kept_for)


def remove_loops_run_once(module: HloModule, result: PropagationResult) -> HloModule:
    """`module` with each While that runs once, and was kept only for what the partitioner removes, replaced by
    its body; then simplified as XLA simplifies after partitioning. `module` itself where there is none."""
    if not any(
        _kept_only_for_the_partitioner(module, inst)
        for c in module.computations
        for inst in c
        if inst.opcode == "while"
    ):
        return module
    edit = ModuleEdit(module)
    removed = False
    for loop in whiles(edit):
        if loop.name not in loop.parent:
            continue
        if not _kept_only_for_the_partitioner(module, loop.instruction):
            continue
        if remove_trivial_loop(loop, side_effect=_side_effect_after_partitioning):
            removed = True
    if not removed:
        return module
    remove_dead_code(edit)

    def partitioned(name: str) -> str:
        return repr(sharding_of(result, name))

    simplified = edit.freeze()
    for _ in range(_ROUNDS):
        simplified = ConstantFolding().run(TupleSimplifier().run(simplified).module).module
        edit = ModuleEdit(simplified)
        merged = merge_common_subexpressions(edit, partitioned)
        remove_dead_code(edit)
        simplified = edit.freeze()
        if not merged:
            break
    return simplified

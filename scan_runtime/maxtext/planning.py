"""MaxText's train step planned for its topology's chip: the plan, and what holds its peak by MaxText's names."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.hlo.ir.module import HloModule
from planner.memory import CHIPS
from planner.memory.holders import holders_at_peak
from planner.passes import Planning, Preparation
from planner.plan.diagnosis.peak_holders import holder_names, peak_holders
from planner.plan.model import Plan
from planner.plan.planner import simulate
from planner.progress import note
from scan_runtime.maxtext.holders import maxtext_holders
from scan_runtime.maxtext.terms import MaxTextStep, topology_chip


@dataclass(frozen=True)
class MaxTextPlan:
    plan: Plan
    step: MaxTextStep
    holders: list[tuple[str, int, list[str]]]  # (kind, bytes per chip, the largest named) at the peak
    hlo: str | None = None  # the step as lowered (`lowered.as_text(dialect="hlo")`), when it was lowered here


def plan_step(module: HloModule, step: MaxTextStep, libtpu: str | None = None, holders: bool = True) -> MaxTextPlan:
    """Plan a lowered MaxText step (`lowering.lower_train_step`'s, or a saved one) for its topology's chip."""
    chip = topology_chip(step.topology)
    if chip not in CHIPS:
        raise ValueError(f"compile_topology={step.topology}: no HBM preset for {chip}")
    capacity = CHIPS[chip].hbm_bytes
    note(f"planning it as {chip}'s compiler takes it")
    prepared = Preparation(chip, libtpu=libtpu).apply(module)
    plan, _ = Planning(capacity).apply(prepared)
    if not holders:
        return MaxTextPlan(plan, step, [])
    # What holds the peak, as the plan's own simulation of the step finds it.
    sim = simulate(prepared, capacity)
    names = holder_names(prepared, sim.result)
    totals = peak_holders(sim.module, sim.estimate, names)
    held = maxtext_holders(sim.module, totals, holders_at_peak(sim.module, sim.estimate, names))
    return MaxTextPlan(plan, step, held)


def plan_maxtext(arguments: Sequence[str], libtpu: str | None = None, holders: bool = True) -> MaxTextPlan:
    """Lower MaxText's train step from `train_compile`'s arguments and plan it."""
    from dataclasses import replace

    from planner import parse_hlo
    from scan_runtime.maxtext.lowering import lower_train_step

    note("lowering MaxText's train step (train_compile, stopped before it compiles)")
    lowered = lower_train_step(arguments)
    module = parse_hlo(lowered.stablehlo, source=f"MaxText {lowered.step.model_name}")
    return replace(plan_step(module, lowered.step, libtpu, holders), hlo=lowered.hlo)


__all__ = ["MaxTextPlan", "plan_maxtext", "plan_step"]

"""A MaxText step's plan as its user reads it: the step in MaxText's keys, the verdict, what holds the peak by
MaxText's names, findings, and the next steps as overrides with the `train_compile` command that confirms one."""

from __future__ import annotations

from planner.plan.model import Plan, VerdictInfo
from planner.units import format_bytes
from scan_runtime.maxtext.next_steps import MaxTextNextStep
from scan_runtime.maxtext.planning import MaxTextPlan
from scan_runtime.maxtext.terms import (
    compile_command,
    fit_line,
    mesh_axes,
    mesh_overrides,
    number,
    parameter_name,
)


def verdict_line(verdict: VerdictInfo | None, total_bytes: int) -> str:
    if verdict is None or verdict.capacity_bytes is None:
        return f"HBM per chip: {format_bytes(total_bytes)}"
    chip = verdict.chip or "the chip"
    capacity = format_bytes(verdict.capacity_bytes)
    margin = verdict.margin_after_bytes
    if verdict.call_after == "fits" and margin is not None:
        return f"fits: {format_bytes(total_bytes)} per chip, {format_bytes(margin)} to spare on {chip} ({capacity})"
    if verdict.call_after == "does not fit" and margin is not None:
        return f"does not fit: {format_bytes(total_bytes)} per chip, {format_bytes(-margin)} over {chip} ({capacity})"
    band = ""
    if verdict.error_band:
        under, over = verdict.error_band
        band = f" (the model's error on such steps: {under:+.0%} to {over:+.0%})"
    return f"{verdict.call_after}: {format_bytes(total_bytes)} per chip on {chip} ({capacity}){band}"


def render(planned: MaxTextPlan, steps: list[MaxTextNextStep]) -> list[str]:
    """The report's lines, none longer than 200 characters."""
    plan, maxtext = planned.plan, planned.step
    mesh = " ".join(mesh_overrides(mesh_axes(plan.mesh))) or "one chip"
    slices = f" x {maxtext.num_slices} slices" if maxtext.num_slices > 1 else ""
    lines = [
        fit_line(f"MaxText {maxtext.model_name} on {maxtext.topology}{slices} ({maxtext.chips} chips): {mesh}"),
        f"  per_device_batch_size={number(maxtext.per_device_batch_size)}"
        f" gradient_accumulation_steps={maxtext.gradient_accumulation_steps} remat_policy={maxtext.remat_policy}"
        f" max_target_length={maxtext.max_target_length}",
        "  verdict: " + verdict_line(plan.verdict, plan.hbm.total_after),
    ]
    if planned.holders:
        lines.append("  at the peak, per chip:")
        for kind, size, items in planned.holders:
            lines.append(fit_line(f"    {kind} {format_bytes(size)}: " + "; ".join(items)))
    lines.extend(_findings(plan))
    lines.extend(_next_steps(planned, steps))
    return lines


def _findings(plan: Plan) -> list[str]:
    lines = []
    for f in plan.findings:
        who = parameter_name(f.name) if f.name else f"{f.loop}[{f.index}]"
        ratio = f.per_device_bytes / max(f.ideal_per_device_bytes, 1)
        lines.append(fit_line(
            f"  finding: {who} {f.shape} holds {format_bytes(f.per_device_bytes)} per chip, {ratio:.1f}x its ideal"
        ))  # fmt: skip
    recommended = [p for p in plan.placements if p.recommended]
    if recommended:
        lines.append(
            f"  the plan pins {len(recommended)} value(s), saving {format_bytes(plan.hbm.saved_bytes)} per chip: "
            "MaxText sets shardings through logical_axis_rules"
        )
    return lines


def _before(step: MaxTextNextStep) -> str:
    """The smaller changes tried before this one: `(x2 first: 97.0 GiB)`."""
    sizes = [format_bytes(t.total_bytes) for t in step.tried if t.total_bytes is not None]
    return f" (the smaller changes before it: {', '.join(sizes)})" if sizes else ""


def _next_steps(planned: MaxTextPlan, steps: list[MaxTextNextStep]) -> list[str]:
    if not steps:
        return []
    lines = ["  next steps, each MaxText's own step lowered with the overrides and planned:"]
    for step in steps:
        said = " ".join(step.overrides) or step.kind
        if step.total_bytes is None:
            lines.append(fit_line(f"    {said}: not predicted: {step.call}"))
        else:
            lines.append(fit_line(f"    {said}: {format_bytes(step.total_bytes)} per chip, {step.call}{_before(step)}"))
    first = next((s for s in steps if s.fits), None)
    if first is not None:
        lines.append("  confirm it with MaxText's own compile (minutes; the plan took seconds):")
        lines.extend(compile_command(planned.step, list(first.overrides)))
    return lines


__all__ = ["render", "verdict_line"]

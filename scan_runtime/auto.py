"""`auto_plan`: one call before training that captures the step, gets a plan and activates it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from planner.plan.manifest import layer_relative
from planner.plan.model import Verification
from planner.units import format_bytes
from scan_runtime.capture import capture_step
from scan_runtime.client import PlannerClient, PlanResult, to_planner_mesh
from scan_runtime.gradient_pins import pin_gradients
from scan_runtime.layer_plan import LayerPlan, PlanMismatch, activate

log = logging.getLogger("scan_runtime")


def auto_plan(
    loss_fn: Callable[..., torch.Tensor],
    *example_args: Any,
    model: torch.nn.Module,
    mesh: Any,
    client: PlannerClient | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    gradients_only: bool = False,
) -> LayerPlan | None:
    """Plan the step `loss_fn(*example_args)` and make the plan active for every following scan.

    `loss_fn` runs the forward and returns the scalar loss; it is traced once
    (with the backward, and `optimizer.step()` when the optimizer is given, so
    the plan is for the step that trains: its state and donated buffers
    included) and not executed, and nothing it traced stays (see
    `capture_step`). Without the optimizer the plan is of the loss and gradients only, and it recommends
    nothing: the update that reads the gradients decides their shardings in the step that trains (with
    SGD's update, none of the gradients a backward alone leaves sharded unlike their weights is so).
    `gradients_only=True` says the step trained is that one (forward and backward, no update: a
    gradient-accumulation micro-step), and its plan recommends as for a whole step. `mesh` is the
    torch_xla Mesh the model is sharded over.
    Returns the active plan, or None when the client is not strict and the
    service could not be reached (training goes on plain).
    """
    client = client or PlannerClient(mesh=mesh)
    if client.mesh is None:
        client.mesh = to_planner_mesh(mesh)
    if gradients_only and optimizer is not None:
        raise ValueError("gradients_only plans a step with no update; an optimizer was given")
    captured = capture_step(loss_fn, example_args, model, client.mesh, optimizer, gradients_only=gradients_only)
    result = client.plan(captured.hlo, captured.manifest)
    if result is None:
        activate(None)
        return None
    for line in plan_lines(result):
        log.info(line)
    plan = LayerPlan.from_plan(result.plan, mesh, result.plan_id)
    shapes = {layer_relative(p.name): tuple(p.shape) for p in captured.manifest.parameters}
    try:
        plan.check_parameters(shapes)
    except PlanMismatch:
        activate(None)
        raise
    activate(plan)
    try:
        pin_gradients(model)
    except PlanMismatch:
        activate(None)
        raise
    return plan


def plan_lines(result: PlanResult) -> list[str]:
    """What the client logs of a plan: its id, the change set and its predicted bytes, and, when the planner
    verified it (`PlannerClient(verify=True)`), what the compilers measured for the step without and with it."""
    plan = result.plan
    hbm = plan.hbm
    change = plan.verdict.change_set_name if plan.verdict is not None else "no verdict"
    lines = [f"plan {result.plan_id} ({result.source}): {change}; HBM per chip {format_bytes(hbm.total_before)} -> "
             f"{format_bytes(hbm.total_after)} predicted"]  # fmt: skip
    # Each recommended placement as the user would write it: what the client applies on the user's behalf.
    for p in plan.placements:
        if p.recommended and p.user is not None:
            lines.append(f"  {p.user.summary}" + (f": {p.user.code}" if p.user.code else ""))
    v = plan.verification
    if v is not None:
        lines.append(f"verified by {v.xla}: {format_bytes(v.before_total_bytes)} -> "
                     f"{format_bytes(v.after_total_bytes)} per device (saves {format_bytes(v.xla_saving_bytes)}, "
                     f"predicted {format_bytes(v.predicted_saving_bytes)})" + _prediction_error(v))  # fmt: skip
        if v.tpu is not None:
            lines.append(f"verified by {v.tpu.xla} ({v.tpu.topology}): {format_bytes(v.tpu.before_total_bytes)} -> "
                         f"{format_bytes(v.tpu.after_total_bytes)} per chip (saves "
                         f"{format_bytes(v.tpu.xla_saving_bytes)})")  # fmt: skip
    elif plan.verification_skipped is not None:
        lines.append(f"not verified: {plan.verification_skipped}")
    if plan.withdrawn is not None:
        lines.append(f"withdrawn: {plan.withdrawn}")
    # What the planner could not stand behind (a partial step, a measurement outside the prediction's band).
    lines += [f"warning: {w}" for w in plan.warnings]
    return lines


def _prediction_error(v: Verification) -> str:
    """How far the prediction of the step as given was from what the verifying compile measured."""
    error = v.prediction_error()
    if error is None:
        return ""
    return f"; the step was predicted at {format_bytes(v.predicted_before_bytes or 0)}, {error:+.1%} from it"

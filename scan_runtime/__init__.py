"""Client runtime: drop-in `scan` / `scan_layers` that apply a sharding plan, and `auto_plan` to get one.

    from scan_runtime import PlannerClient, auto_plan, scan_layers

    auto_plan(lambda x: model(x).pow(2).mean(), batch, model=model, mesh=mesh)  # the one added line
    ...
    y = scan_layers(model.layers, x)  # now pins each weight slice as the plan says

Needs torch and torch_xla (the `xla` extra).
"""

from scan_runtime.auto import auto_plan
from scan_runtime.client import PlannerClient, PlannerRefused, PlannerUnavailable, PlanResult
from scan_runtime.layer_plan import LayerPlan, PlanMismatch, activate, current_plan, use_plan
from scan_runtime.scan import scan, scan_layers

__all__ = [
    "LayerPlan",
    "PlanMismatch",
    "PlanResult",
    "PlannerClient",
    "PlannerRefused",
    "PlannerUnavailable",
    "activate",
    "auto_plan",
    "current_plan",
    "scan",
    "scan_layers",
    "use_plan",
]

"""Client runtime: drop-in `scan` / `scan_layers` that apply a sharding plan, and `auto_plan` to get one.

    from scan_runtime import PlannerClient, auto_plan, scan_layers

    auto_plan(lambda x: model(x).pow(2).mean(), batch, model=model, mesh=mesh)  # the one added line
    ...
    y = scan_layers(model.layers, x)  # now pins each weight slice as the plan says

The torch_xla side needs torch and torch_xla (the `xla` extra) and is imported on first use, so
`scan_runtime.jax` (JAX's `plan_step` and `scan`) works where torch is not installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from scan_runtime.client import PlannerClient, PlannerRefused, PlannerUnavailable, PlanResult
from scan_runtime.layer_plan import LayerPlan, PlanMismatch, activate, current_plan, use_plan

if TYPE_CHECKING:
    from scan_runtime.auto import auto_plan
    from scan_runtime.decoder_layers import scan_decoder_layers
    from scan_runtime.scan import scan, scan_layers

# The names that need torch: public name -> the module that defines it, imported when first read.
_TORCH_SIDE = {
    "auto_plan": "scan_runtime.auto",
    "scan": "scan_runtime.scan",
    "scan_layers": "scan_runtime.scan",
    "scan_decoder_layers": "scan_runtime.decoder_layers",
}

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
    "scan_decoder_layers",
    "scan_layers",
    "use_plan",
]


def __getattr__(name: str) -> Any:
    if name in _TORCH_SIDE:
        return getattr(importlib.import_module(_TORCH_SIDE[name]), name)
    raise AttributeError(f"module 'scan_runtime' has no attribute {name!r}")

"""A plan's `pin-output` placements applied in torch_xla: each named gradient sharded where backward writes it.

A gradient the step returns (a token embedding's, an LM head's) gets its sharding from propagation,
which can leave it split over fewer devices than its parameter. `mark_sharding` on the parameter's
`.grad` pins it: a hook that runs once the gradient is accumulated (`register_post_accumulate_grad_hook`)
annotates it there, inside the same traced step, so the optimizer and the step's outputs read it
pinned. The hook asks the active plan each time: with no plan (or one that does not name the
parameter) it does nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from weakref import WeakSet

import torch
import torch_xla.distributed.spmd as xs

from scan_runtime.layer_plan import PlanMismatch, current_plan

_HOOKED: WeakSet[torch.Tensor] = WeakSet()


def pin_gradients(model: torch.nn.Module) -> None:
    """Hook every parameter of `model` (once) so the active plan's gradient pins apply in backward."""
    plan = current_plan()
    if plan is not None:
        named = dict(model.named_parameters())
        unknown = sorted(set(plan.gradient_pins) - set(named))
        if unknown:
            raise PlanMismatch(f"the plan pins the gradients of {unknown}, which the model does not have")
        for name, spec in plan.gradient_pins.items():
            if len(spec) != named[name].dim():
                raise PlanMismatch(f"the plan pins the gradient of {name} with partition spec {spec}, but {name} "
                                   f"has shape {tuple(named[name].shape)}")  # fmt: skip
    for name, p in model.named_parameters():
        if p.requires_grad and p not in _HOOKED:
            p.register_post_accumulate_grad_hook(_pin_gradient_of(name))
            _HOOKED.add(p)


def _pin_gradient_of(name: str) -> Callable[[torch.Tensor], None]:
    def pin(p: torch.Tensor) -> None:
        plan = current_plan()
        if plan is None or p.grad is None:
            return
        spec = plan.gradient_pins.get(name)
        if spec is not None:
            xs.mark_sharding(p.grad, plan.mesh, spec)

    return pin

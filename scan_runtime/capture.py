"""Capture one training step as the planner reads it: HLO of loss and gradients, plus a manifest.

The step is traced, not run: torch_xla records the forward and the backward
lazily, `_get_xla_tensors_hlo` prints the pending graph of the loss and the
gradients (with every sharding annotation, before partitioning), and the
graph is then dropped without executing. The manifest says which output is
whose gradient and each parameter's partition spec over the mesh's axis
names, read back from torch_xla.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch_xla

from planner.mesh import Mesh
from planner.plan.manifest import Manifest, ManifestParameter, spec_from_sharding
from planner.sharding.text import parse_sharding


@dataclass(frozen=True)
class CapturedStep:
    hlo: str
    manifest: Manifest


def capture_step(loss_fn: Callable[..., torch.Tensor], args: tuple[Any, ...], model: torch.nn.Module,
                 mesh: Mesh) -> CapturedStep:  # fmt: skip
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    loss = loss_fn(*args)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise ValueError("the step function must return the scalar loss")
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    kept = [(name, p, g) for (name, p), g in zip(named, grads) if g is not None]
    hlo = torch_xla._XLAC._get_xla_tensors_hlo([loss, *(g for _, _, g in kept)])
    parameters = [
        ManifestParameter(name=name, shape=list(p.shape), partition_spec=_spec(p, mesh)) for name, p, _ in kept
    ]
    manifest = Manifest(outputs=[None, *(name for name, _, _ in kept)], parameters=parameters)
    return CapturedStep(hlo, manifest)


def _spec(t: torch.Tensor, mesh: Mesh) -> list[Any]:
    text = torch_xla._XLAC._get_xla_sharding_spec(t)
    if not text:
        return [None] * t.dim()
    return spec_from_sharding(parse_sharding(text), t.dim(), mesh)

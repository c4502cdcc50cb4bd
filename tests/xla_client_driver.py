"""Runs the client runtime on real torch_xla SPMD (8 virtual CPU devices) and prints JSON results.

Run in a subprocess (PJRT_DEVICE=CPU CPU_NUM_DEVICES=8 are read once per process):

    python tests/xla_client_driver.py MODE [--url URL] [--cache DIR]

MODE `mismatch`: gradients sharded unlike their weights by a forward and backward (no update), without a plan
and after `auto_plan(..., gradients_only=True)`, its plan of that step.
MODE `losses`: three SGD steps without and with that plan.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("CPU_NUM_DEVICES", "8")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import numpy as np
import torch
import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from llama_layers import ACTIVATION_SPEC, LlamaStack, loss_of, sgd_step, shard_model

from scan_runtime import PlannerClient, activate, auto_plan

CONFIG = {"layers": 4, "dim": 256, "hidden": 1024, "heads": 4}
BATCH, SEQ = 8, 64


def build(mesh: xs.Mesh) -> tuple[LlamaStack, torch.Tensor]:
    torch.manual_seed(0)
    model = LlamaStack(**CONFIG).to(torch_xla.device())
    shard_model(model, mesh)
    x = torch.randn(BATCH, SEQ, CONFIG["dim"]).to(torch_xla.device())
    xs.mark_sharding(x, mesh, ACTIVATION_SPEC)
    return model, x


def mismatched(model: LlamaStack, x: torch.Tensor) -> list[str]:
    for p in model.parameters():
        p.grad = None
    loss_of(model, x).backward()
    torch_xla.sync()
    spec = torch_xla._XLAC._get_xla_sharding_spec
    return [n for n, p in model.named_parameters() if spec(p.grad) != spec(p)]


def sgd_losses(model: LlamaStack, x: torch.Tensor, steps: int = 3, lr: float = 0.05) -> list[float]:
    return [float(sgd_step(model, x, lr).item()) for _ in range(steps)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["mismatch", "losses", "plain"])
    ap.add_argument("--url")
    ap.add_argument("--cache", type=Path)
    args = ap.parse_args()
    xr.use_spmd()
    mesh = xs.Mesh(np.arange(8), (4, 2), ("fsdp", "tp"))
    client = PlannerClient(url=args.url, mesh=mesh, cache_dir=args.cache)
    out: dict[str, object] = {}
    model, x = build(mesh)
    if args.mode == "mismatch":
        out["before"] = mismatched(model, x)
        plan = auto_plan(
            lambda batch: loss_of(model, batch), x, model=model, mesh=mesh, client=client, gradients_only=True
        )
        assert plan is not None
        out["pins"] = {k: list(v) for k, v in plan.pins.items()}
        out["plan_id"] = plan.plan_id
        out["plan"] = plan.plan.model_dump(mode="json") if plan.plan else None
        out["after"] = mismatched(model, x)
    elif args.mode == "plain":
        # Without a plan, ours and torch_xla's scan_layers: same graph, same numbers, same shardings.
        from torch_xla.experimental.scan_layers import scan_layers as xla_scan_layers

        activate(None)
        spec = torch_xla._XLAC._get_xla_sharding_spec
        for name, run in (("ours", model), ("torch_xla", lambda batch: xla_scan_layers(model.layers, batch))):
            for p in model.parameters():
                p.grad = None
            loss = run(x).pow(2).mean()
            loss.backward()
            torch_xla.sync()
            out[name] = {"loss": float(loss.item()), "grad_shardings": [spec(p.grad) for p in model.parameters()],
                         "grads": [float(p.grad.abs().sum().item()) for p in model.parameters()]}  # fmt: skip
    else:
        activate(None)
        out["without"] = sgd_losses(model, x)
        model, x = build(mesh)
        auto_plan(lambda batch: loss_of(model, batch), x, model=model, mesh=mesh, client=client, gradients_only=True)
        out["with"] = sgd_losses(model, x)
    print("RESULT " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Train a Llama-like layer stack with `scan_layers` on 8 virtual CPU devices, with an automatic plan.

    .venv/bin/python examples/train_llama_scan.py [--steps 3] [--url http://127.0.0.1:8000] [--chip v6e | --hbm-gib 32]

The model is sharded FSDP x TP (mesh fsdp=4, tp=2) with the usual 2D weight
specs, trained by SGD. `auto_plan` traces one step (forward, backward and
SGD's update), gets a plan (in-process, or from the service at --url) and
activates it; the following steps run with each weight slice pinned as
planned. The script prints the plan's summary, the predicted HBM per chip
before and after, and how many gradients come out sharded unlike their
weights. The step runs on XLA:CPU here, so by default the plan predicts
XLA:CPU against a 32 GiB budget; `--chip v6e` plans for that chip's XLA:TPU
instead (where this small step's temporaries fit on-chip memory, so fewer pins
pay off).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("CPU_NUM_DEVICES", "8")
# torch_xla's shard_as reaches JAX through torchax; on a machine without a TPU, JAX probing for one
# through libtpu prints half a dozen error lines before the first line of output.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from llama_layers import ACTIVATION_SPEC, LlamaStack, loss_of, shard_model

from planner.units import format_bytes
from scan_runtime import PlannerClient, PlannerUnavailable, auto_plan


def mib(n: int) -> str:
    return format_bytes(n)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--url", help="planner service; default: plan in-process")
    ap.add_argument("--chip", help="plan for this chip preset's compiler (e.g. v6e); default: XLA:CPU")
    ap.add_argument("--hbm-gib", type=float, default=32.0, help="HBM per chip when no --chip is given")
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()

    xr.use_spmd()
    mesh = xs.Mesh(np.arange(8), (4, 2), ("fsdp", "tp"))
    torch.manual_seed(0)
    model = LlamaStack(layers=args.layers, dim=256, hidden=1024, heads=4).to(torch_xla.device())
    shard_model(model, mesh)
    x = torch.randn(8, 64, 256).to(torch_xla.device())
    xs.mark_sharding(x, mesh, ACTIVATION_SPEC)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    # The one added line: trace a step (its update too), get the plan, activate it for the scans that follow.
    client = PlannerClient(url=args.url, mesh=mesh, chip=args.chip,
                           hbm_bytes=None if args.chip else int(args.hbm_gib * 2**30))  # fmt: skip
    try:
        plan = auto_plan(lambda batch: loss_of(model, batch), x, model=model, mesh=mesh, client=client,
                         optimizer=optimizer)  # fmt: skip
    except PlannerUnavailable as e:
        print(f"no plan ({e}): training plain")
        plan = None

    if plan is not None and plan.plan is not None:
        p = plan.plan
        print(f"plan {plan.plan_id} for {p.module} on mesh {p.mesh}")
        if p.verdict is not None:
            print(f"  verdict: {p.verdict.summary}")
        print(f"  HBM per chip: {mib(p.hbm.total_before)} -> {mib(p.hbm.total_after)} "
              f"of {mib(p.hbm.capacity_bytes or 0)}")  # fmt: skip
        for f in p.findings:
            # The parameter the buffer belongs to where the plan names it, else its place in the loop.
            what = f.name or f"{f.loop}[{f.index}]"
            print(f"  [{f.kind}] {what} {f.shape}: {mib(f.per_device_bytes)} per chip, "
                  f"ideal {mib(f.ideal_per_device_bytes)}, after {mib(f.per_device_bytes_after or 0)}")  # fmt: skip
        pinned = ", ".join(f"{n} {s}" for n, s in plan.pins.items())
        change = p.verdict.change_set_name if p.verdict is not None else "no verdict"
        print(f"  pinned inside the scanned layer: {pinned or f'nothing ({change})'}")
        for note in plan.notes:
            print(f"  note: {note}")
    elif plan is not None or args.url is None:
        print("no plan: training plain")

    spec = torch_xla._XLAC._get_xla_sharding_spec
    for step in range(args.steps):
        optimizer.zero_grad()
        loss = loss_of(model, x)
        loss.backward()
        optimizer.step()
        torch_xla.sync()
        unlike = sum(spec(q.grad) != spec(q) for q in model.parameters())
        print(f"step {step}: loss {loss.item():.6f}, gradients sharded unlike their weights: {unlike}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Trains transformers' Llama on torch_xla (8 virtual CPU devices) for three AdamW steps, with or without the
client's capture of the second step before it runs, and writes what the test compares.

    python tests/hf_step_driver.py plain|captured|planned OUT_DIR [scan|loop]

The model (hidden 256, 4 layers, GQA 8/2, vocab 1024) is sharded as torch_xla's FSDPv2 examples shard one
(mesh fsdp=4 x tensor=2: q/k/v/gate/up and the head split over tensor on their output dim and fsdp on the
input, o/down the other way round, the embedding over fsdp, the batch over fsdp), its decoder layers run
through `scan_decoder_layers` (or the model's own loop), AdamW. Step 1 runs first (it creates AdamW's
state); the dump directory is then emptied, so the largest module left is step 2's. OUT_DIR gets
`result.json` (losses, shardings, compiles, step 2's allocations) and, for `captured`, `captured.hlo` and
`manifest.json`, for `planned` (`auto_plan` before step 2, verified, its plan applied from step 2 on)
`plan.json` and the client's log `client.log`;
`step.hlo` is step 2's module as torch_xla compiled it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("CPU_NUM_DEVICES", "8")
os.environ["XLA_FLAGS"] = f"--xla_dump_to={tempfile.mkdtemp(prefix='hf-step-dump-')} --xla_dump_hlo_as_text"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
import transformers

from fidelity.dumps import allocation_bytes_by_kind, largest_module
from scan_runtime import auto_plan, scan_decoder_layers
from scan_runtime.capture import capture_step
from scan_runtime.client import PlannerClient, to_planner_mesh

DUMP = Path(os.environ["XLA_FLAGS"].split()[0].removeprefix("--xla_dump_to="))
SIZES = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2,
         "num_hidden_layers": 4, "vocab_size": 1024, "attn_implementation": "eager"}  # fmt: skip
# HF_STEP_SIZES='{"hidden_size": 512, ...}' overrides some (a larger step than the test's).
SIZES |= json.loads(os.environ.get("HF_STEP_SIZES", "{}"))
# Column-parallel weights (out x in): out over tensor, in over fsdp; the rest the other way round.
COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "lm_head")


def shard(model: torch.nn.Module, mesh: xs.Mesh) -> None:
    for name, p in model.named_parameters():
        if p.dim() == 1:
            continue
        if "embed_tokens" in name:
            spec: tuple[str | None, ...] = ("fsdp", None)
        elif any(c in name for c in COLUMN):
            spec = ("tensor", "fsdp")
        else:
            spec = ("fsdp", "tensor")
        xs.mark_sharding(p, mesh, spec)


def _xla_state_specs(state: dict) -> dict:
    spec = torch_xla._XLAC._get_xla_sharding_spec
    return {k: spec(v) for k, v in state.items() if isinstance(v, torch.Tensor) and v.device.type == "xla"}


def main() -> int:
    mode, out = sys.argv[1], Path(sys.argv[2])
    layers = sys.argv[3] if len(sys.argv) > 3 else "scan"
    out.mkdir(parents=True, exist_ok=True)
    xr.use_spmd()
    torch.manual_seed(0)
    device = torch_xla.device()
    mesh = xs.Mesh(np.arange(8), (4, 2), ("fsdp", "tensor"))
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZES)).to(device)
    shard(model, mesh)
    if layers == "scan":
        scan_decoder_layers(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    batches = [torch.randint(0, SIZES["vocab_size"], (8, 64)) for _ in range(3)]

    def loss_of(ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, labels=ids, use_cache=False).loss

    def on_device(ids: torch.Tensor) -> torch.Tensor:
        ids = ids.to(device)
        xs.mark_sharding(ids, mesh, ("fsdp", None))
        return ids

    losses = []
    for step, batch in enumerate(batches):
        ids = on_device(batch)
        if step == 1:
            xm.wait_device_ops()
            shutil.rmtree(DUMP)
            DUMP.mkdir()
            if mode == "captured":
                captured = capture_step(loss_of, (ids,), model, to_planner_mesh(mesh), optimizer)
                (out / "captured.hlo").write_text(captured.hlo)
                (out / "manifest.json").write_text(captured.manifest.model_dump_json())
            elif mode == "planned":
                client_log = logging.getLogger("scan_runtime")
                client_log.addHandler(logging.FileHandler(out / "client.log"))
                client_log.setLevel(logging.INFO)
                client = PlannerClient(mesh=mesh, cache_dir=out / "plans", verify=True)
                plan = auto_plan(loss_of, ids, model=model, mesh=mesh, client=client, optimizer=optimizer)
                assert plan is not None and plan.plan is not None
                (out / "plan.json").write_text(plan.plan.model_dump_json())
            compiles_before = len((met.metric_data("CompileTime") or (0, 0, []))[2])
        optimizer.zero_grad()
        loss = loss_of(ids)
        loss.backward()
        optimizer.step()
        torch_xla.sync()
        losses.append(loss.item())
        if step == 1:
            xm.wait_device_ops()
            module = largest_module(DUMP)
            shutil.copy(module.before_optimizations, out / "step.hlo")
            by_kind = allocation_bytes_by_kind(module.buffer_assignment.read_text())
    spec = torch_xla._XLAC._get_xla_sharding_spec
    named = list(model.named_parameters())
    result = {
        "losses": losses,
        "parameter_shardings": {n: spec(p) for n, p in named},
        "gradient_shardings": {n: spec(p.grad) for n, p in named if p.grad is not None},
        "state_shardings": {n: _xla_state_specs(optimizer.state[p]) for n, p in named},
        "parameter_sums": {n: float(p.detach().double().abs().sum().cpu()) for n, p in named},
        "compiles_from_step_2": len((met.metric_data("CompileTime") or (0, 0, []))[2]) - compiles_before,
        "step_2_allocation_bytes_by_kind": by_kind,
    }
    (out / "result.json").write_text(json.dumps(result, indent=1))
    shutil.rmtree(DUMP, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

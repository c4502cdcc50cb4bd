"""Trains a transformers model on torch_xla (8 virtual CPU devices) for three AdamW steps (by default), with or
without the client's capture of the second step before it runs, and writes what the test compares.

    python tests/hf_step_driver.py plain|captured|planned|partial OUT_DIR [scan|loop] [MODEL] [STEP]

MODEL is one of `ARCHITECTURES` (default llama): Llama; Qwen2 (q/k/v biases); Phi-3 (fused qkv_proj and
gate_up_proj); Gemma (its head tied to the embedding); Mistral (sliding-window attention); Mixtral (4 experts,
top 2). The model (hidden 256, 4 layers, GQA 8/2, vocab 1024) is sharded as torch_xla's FSDPv2 examples shard
one (mesh fsdp=4 x tensor=2: q/k/v/gate/up, their fused forms and the head split over tensor on their output
dim and fsdp on the input, o/down the other way round, the embedding over fsdp, the batch over fsdp), its
decoder layers run through `scan_decoder_layers` (or the model's own loop), AdamW. Step 1 runs first (it
creates AdamW's state); the dump directory is then emptied, so the largest module left is step 2's. OUT_DIR
gets `result.json` (losses, shardings, compiles, step 2's allocations) and, for `captured`, `captured.hlo`
and `manifest.json`; for `planned` (`auto_plan(..., optimizer=)` before step 2, verified, its plan applied
from step 2 on) and `partial` (`auto_plan` without the optimizer: a plan of the loss and gradients only, not
verified) `plan.json` and the client's log `client.log`; `step.hlo` is step 2's module as torch_xla compiled
it. STEP (default 1) moves all of that to another step: 0 plans before the first step, as a new user calls
`auto_plan` before training, when AdamW's state is not made yet. The run trains HF_STEP_AFTER (default 1)
steps after it. HF_STEP_VERIFY=0 leaves `planned` unverified.
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
# architecture -> (config class, what its config needs beyond the common sizes)
ARCHITECTURES = {
    "llama": ("LlamaConfig", {}),
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": False}),
    # Its default special tokens (32000 and up) are outside a small vocabulary.
    "phi3": ("Phi3Config", {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}),
    "gemma": ("GemmaConfig", {"head_dim": 32, "tie_word_embeddings": True}),
    "mistral": ("MistralConfig", {"sliding_window": 32}),
    # Experts in one batched matmul: transformers' default (grouped_mm) takes bf16 only.
    "mixtral": (
        "MixtralConfig",
        {
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "experts_implementation": "batched_mm",
            "sliding_window": None,
        },
    ),
}
# HF_STEP_SIZES='{"hidden_size": 512, ...}' overrides some (a larger step than the test's).
SIZES |= json.loads(os.environ.get("HF_STEP_SIZES", "{}"))
# Column-parallel weights (out x in): out over tensor, in over fsdp; the rest the other way round.
COLUMN = ("q_proj", "k_proj", "v_proj", "qkv_proj", "gate_proj", "up_proj", "gate_up_proj", "lm_head")


def shard(model: torch.nn.Module, mesh: xs.Mesh) -> None:
    for name, p in model.named_parameters():
        if p.dim() == 1 or name.endswith("mlp.gate.weight"):  # norms, biases and a router stay replicated
            continue
        if "embed_tokens" in name:
            spec: tuple[str | None, ...] = ("fsdp", None)
        elif any(c in name for c in COLUMN):
            spec = ("tensor", "fsdp")
        else:
            spec = ("fsdp", "tensor")
        # Mixtral's experts are stacked [experts, out, in]: each expert sharded as a dense projection.
        xs.mark_sharding(p, mesh, (None,) * (p.dim() - 2) + spec)


def _xla_state_specs(state: dict) -> dict:
    spec = torch_xla._XLAC._get_xla_sharding_spec
    return {k: spec(v) for k, v in state.items() if isinstance(v, torch.Tensor) and v.device.type == "xla"}


def main() -> int:
    mode, out = sys.argv[1], Path(sys.argv[2])
    layers = sys.argv[3] if len(sys.argv) > 3 else "scan"
    architecture = sys.argv[4] if len(sys.argv) > 4 else "llama"
    # The step captured or planned before it runs (and compared): 1, the second, once AdamW's state exists;
    # 0, the first, as a new user calls `auto_plan` before training, with AdamW's state not made yet.
    planned_step = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    out.mkdir(parents=True, exist_ok=True)
    xr.use_spmd()
    torch.manual_seed(0)
    device = torch_xla.device()
    mesh = xs.Mesh(np.arange(8), (4, 2), ("fsdp", "tensor"))
    config_class, extra = ARCHITECTURES[architecture]
    config = getattr(transformers, config_class)(**SIZES, **extra)
    model = transformers.AutoModelForCausalLM.from_config(config).to(device)
    if config.tie_word_embeddings:
        model.tie_weights()  # `.to()` onto an XLA device gives each module a parameter of its own
    shard(model, mesh)
    if layers == "scan":
        scan_decoder_layers(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    # The step planned, and (HF_STEP_AFTER, default 1) steps after it: what it wrote is read again.
    after = int(os.environ.get("HF_STEP_AFTER", "1"))
    batches = [torch.randint(0, SIZES["vocab_size"], (8, 64)) for _ in range(planned_step + 1 + after)]

    def loss_of(ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, labels=ids, use_cache=False).loss

    def on_device(ids: torch.Tensor) -> torch.Tensor:
        ids = ids.to(device)
        xs.mark_sharding(ids, mesh, ("fsdp", None))
        return ids

    losses = []
    for step, batch in enumerate(batches):
        ids = on_device(batch)
        if step == planned_step:
            xm.wait_device_ops()
            shutil.rmtree(DUMP)
            DUMP.mkdir()
            if mode == "captured":
                captured = capture_step(loss_of, (ids,), model, to_planner_mesh(mesh), optimizer)
                (out / "captured.hlo").write_text(captured.hlo)
                (out / "manifest.json").write_text(captured.manifest.model_dump_json())
            elif mode in ("planned", "partial"):
                client_log = logging.getLogger("scan_runtime")
                client_log.addHandler(logging.FileHandler(out / "client.log"))
                client_log.setLevel(logging.INFO)
                whole = mode == "planned"
                verify = whole and os.environ.get("HF_STEP_VERIFY", "1") == "1"
                client = PlannerClient(mesh=mesh, cache_dir=out / "plans", verify=verify)
                plan = auto_plan(loss_of, ids, model=model, mesh=mesh, client=client,
                                 optimizer=optimizer if whole else None)  # fmt: skip
                assert plan is not None and plan.plan is not None
                (out / "plan.json").write_text(plan.plan.model_dump_json())
            compiles_before = len((met.metric_data("CompileTime") or (0, 0, []))[2])
        optimizer.zero_grad()
        loss = loss_of(ids)
        loss.backward()
        optimizer.step()
        torch_xla.sync()
        losses.append(loss.item())
        if step == planned_step:
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

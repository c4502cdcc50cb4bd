"""Runs a transformers model on torch_xla (8 virtual CPU devices), its decoder layers plain or scanned, and
prints its loss, its number of gradients and their summed magnitude as JSON.

    python tests/hf_scan_driver.py FAMILY plain|scan
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("CPU_NUM_DEVICES", "8")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch_xla
import torch_xla.runtime as xr
import transformers

from scan_runtime import scan_decoder_layers

# family -> (config class, model class, what the family's config needs beyond the common sizes)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 32}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 32}),
    # Experts in one batched matmul: transformers' default (grouped_mm) takes bf16 only.
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        {"num_local_experts": 4, "num_experts_per_tok": 2, "experts_implementation": "batched_mm"},
    ),
}
SIZES = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2,
         "num_hidden_layers": 4, "vocab_size": 1024, "attn_implementation": "eager"}  # fmt: skip


def main() -> int:
    family, mode = sys.argv[1], sys.argv[2]
    xr.use_spmd()
    torch.manual_seed(0)
    config_class, model_class, extra = FAMILIES[family]
    config = getattr(transformers, config_class)(**SIZES, **extra)
    device = torch_xla.device()
    model = getattr(transformers, model_class)(config).to(device)
    if mode == "scan":
        scan_decoder_layers(model)
    ids = torch.randint(0, SIZES["vocab_size"], (2, 32)).to(device)
    out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    torch_xla.sync()
    grads = [p.grad.abs().sum().item() for p in model.parameters() if p.grad is not None]
    print(json.dumps({"loss": out.loss.item(), "num_grads": len(grads), "grad_sum": sum(grads)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

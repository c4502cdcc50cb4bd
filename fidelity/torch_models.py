"""torch_xla's models: the project's example layer stack, alone or inside a language model.

Nothing here imports torch at module level: the runner sets PJRT's device count and XLA's flags first.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from fidelity.cases import Case

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"
# The language model's own weights, [out, in] as torch stores them: the embedding [vocab, hidden]
# shards vocab over tp and hidden over fsdp, as the JAX steps shard theirs; the head [vocab, hidden] is
# a column-parallel projection with the same spec, so a tied head is the embedding itself.
LM_PARTITION_SPECS = {"embed.weight": ("tp", "fsdp"), "head.weight": ("tp", "fsdp"), "norm.weight": None}
TOKENS_SPEC = ("fsdp", None)


def example_llama_layers() -> Any:
    """The project's example model module (examples/ is a directory of scripts, not a package)."""
    if str(EXAMPLES_DIR) not in sys.path:
        sys.path.insert(0, str(EXAMPLES_DIR))
    import llama_layers

    return llama_layers


def _stack(case: Case) -> Any:
    example = example_llama_layers()
    size = case.size
    # The example layer has plain multi-head attention and no RoPE: heads are all the size it takes.
    if size.num_kv_heads != size.num_heads:
        raise ValueError(f"the example layer has no grouped-query attention (num_kv_heads={size.num_kv_heads})")
    return example.LlamaStack(size.num_layers, size.hidden_size, size.ffn_size, size.num_heads)


def torch_llama(case: Case, mesh: Any) -> tuple[Any, Any]:
    """(model, x) from the project's example layer stack, sharded as the example shards it."""
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs

    example = example_llama_layers()
    size = case.size
    torch.manual_seed(0)
    model = _stack(case).to(torch_xla.device())
    example.shard_model(model, mesh)
    x = torch.randn(size.batch_size, size.seq_len, size.hidden_size).to(torch_xla.device())
    xs.mark_sharding(x, mesh, example.ACTIVATION_SPEC)
    return model, x


def torch_lm(case: Case, mesh: Any) -> tuple[Any, Any]:
    """(model, tokens): embedding, the example stack (`model.stack.layers`), RMSNorm and an LM head
    (tied to the embedding for `lm_tied`), sharded; int64 tokens [batch, seq + 1] split over fsdp."""
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs
    from torch import nn

    example = example_llama_layers()
    size = case.size

    class LanguageModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(size.vocab_size, size.hidden_size)
            self.stack = _stack(case)
            self.norm = example.RMSNorm(size.hidden_size)
            self.head = nn.Linear(size.hidden_size, size.vocab_size, bias=False)

    torch.manual_seed(0)
    model = LanguageModel().to(torch_xla.device())
    if case.step == "lm_tied":
        # Tied after the move: `.to()` onto an XLA device gives each module a parameter of its own.
        model.head.weight = model.embed.weight
    example.shard_model(model.stack, mesh)
    for name, spec in LM_PARTITION_SPECS.items():
        if spec is not None:
            xs.mark_sharding(model.get_parameter(name), mesh, spec)
    tokens = torch.randint(0, size.vocab_size, (size.batch_size, size.seq_len + 1)).to(torch_xla.device())
    xs.mark_sharding(tokens, mesh, TOKENS_SPEC)
    return model, tokens


def lm_loss(model: Any, tokens: Any, run_layers: Any) -> Any:
    """Cross-entropy in f32 of the next token: F.cross_entropy is log_softmax + nll_loss (a gather)."""
    import torch.nn.functional as F

    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    y = run_layers(model.embed(inputs))
    logits = model.head(model.norm(y)).float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

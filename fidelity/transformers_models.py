"""transformers' decoder models for torch_xla steps: built from a small config of the package's, sharded as
torch_xla's FSDPv2 examples shard one.

Nothing here imports torch or transformers at module level: the runner sets PJRT's device count and XLA's
flags first.
"""

from __future__ import annotations

from typing import Any

from fidelity.cases import Case

# Column-parallel projections ([out, in] as torch stores them): out over tp, in over fsdp; the
# row-parallel ones (o_proj, down_proj) the other way round; the token embedding over fsdp on the
# vocabulary; norms (1-D) replicated. The head is column-parallel, or the embedding itself when tied.
COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "qkv_proj", "gate_proj", "up_proj", "gate_up_proj", "lm_head")
EMBEDDING_SPEC = ("fsdp", None)
COLUMN_SPEC = ("tp", "fsdp")
ROW_SPEC = ("fsdp", "tp")
TOKENS_SPEC = ("fsdp", None)


def partition_spec(name: str, rank: int) -> tuple[str | None, ...] | None:
    """The spec a parameter of this name and rank is marked with (None: left replicated).

    Mixtral's experts are stacked [experts, out, in] (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`):
    each expert's projection is sharded as a dense one, the experts dim whole; its router (`mlp.gate`,
    [experts, hidden]) is left replicated."""
    if rank == 1 or name.endswith("mlp.gate.weight"):
        return None
    if "embed_tokens" in name:
        return EMBEDDING_SPEC
    spec = COLUMN_SPEC if any(c in name for c in COLUMN_PARALLEL) else ROW_SPEC
    return (None,) * (rank - 2) + spec


def config(case: Case) -> Any:
    """The model's config from the case's sizes: eager attention, no cache, the head tied for Gemma."""
    import transformers

    size = case.size
    common: dict[str, Any] = {
        "hidden_size": size.hidden_size,
        "intermediate_size": size.ffn_size,
        "num_attention_heads": size.num_heads,
        "num_key_value_heads": size.num_kv_heads,
        "head_dim": size.head_size,
        "num_hidden_layers": size.num_layers,
        "vocab_size": size.vocab_size,
        "max_position_embeddings": max(2048, size.seq_len),
        "attn_implementation": "eager",
        "use_cache": False,
    }
    model = case.transformers_model
    if model == "llama":
        return transformers.LlamaConfig(**common, tie_word_embeddings=False)
    if model == "mistral":
        # A window shorter than the sequence, so the sliding-window mask is not the causal one.
        return transformers.MistralConfig(**common, sliding_window=size.seq_len // 2, tie_word_embeddings=False)
    if model == "gemma":
        return transformers.GemmaConfig(**common, tie_word_embeddings=True)
    if model == "mixtral":
        # batched_mm: each token's top-k experts' weights gathered and multiplied in one batched matmul, static
        # shapes throughout (transformers' default, grouped_mm, takes bf16 only; eager loops over the
        # experts a batch routes to, a data-dependent shape). PretrainedConfig takes it; MixtralConfig's typed
        # signature does not list it.
        return transformers.MixtralConfig(**common, num_local_experts=size.num_experts,
                                          num_experts_per_tok=size.top_k, experts_implementation="batched_mm",
                                          sliding_window=None, tie_word_embeddings=False)  # type: ignore[call-arg]  # fmt: skip
    if model == "qwen2":
        # Qwen2's q/k/v projections carry biases (1-D, left replicated like the norms).
        return transformers.Qwen2Config(**common, tie_word_embeddings=False)
    if model == "phi3":
        # One qkv_proj and one gate_up_proj per layer; the token ids its config defaults to (32000 and up)
        # are outside a small vocabulary.
        return transformers.Phi3Config(**common, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
                                       eos_token_id=2)  # fmt: skip
    raise ValueError(f"{case.name}: no transformers model {model!r}")


def transformers_lm(case: Case, mesh: Any) -> tuple[Any, Any, dict[str, tuple[str | None, ...]]]:
    """(model, tokens, specs): the causal LM on the XLA device, every parameter marked with its spec,
    int64 tokens [batch, seq] split over fsdp; `specs` the parameter name -> spec marked."""
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config(case)).to(torch_xla.device())
    if case.step == "lm_tied":
        # `.to()` onto an XLA device gives each module a parameter of its own: tie them again.
        model.tie_weights()
    specs: dict[str, tuple[str | None, ...]] = {}
    for name, p in model.named_parameters():
        spec = partition_spec(name, p.dim())
        if spec is not None:
            xs.mark_sharding(p, mesh, spec)
            specs[name] = spec
    size = case.size
    tokens = torch.randint(0, size.vocab_size, (size.batch_size, size.seq_len)).to(torch_xla.device())
    xs.mark_sharding(tokens, mesh, TOKENS_SPEC)
    return model, tokens, specs


def transformers_loss(model: Any, tokens: Any) -> Any:
    """The model's own loss: labels are the inputs, shifted by one inside (F.cross_entropy, a gather)."""
    return model(input_ids=tokens, labels=tokens, use_cache=False).loss

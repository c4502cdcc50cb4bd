"""Model builders: the Llama training step for each front end, with its parameter shardings.

Nothing here imports jax or torch at module level: each runner configures XLA (device count, dump
directory) through environment variables that are read once, when the framework is first imported.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from fidelity.cases import Case, LlamaSize

# Stacked params [num_layers, ...]. Megatron-style 2D sharding on [in, out] weights: column-parallel
# projections shard `in` over fsdp and `out` over tp, the row-parallel ones the other way round.
JAX_PARAM_SPECS: dict[str, tuple[str | None, ...]] = {
    "attn_norm": (None, None),
    "mlp_norm": (None, None),
    "wq": (None, "fsdp", "tp"),
    "wk": (None, "fsdp", "tp"),
    "wv": (None, "fsdp", "tp"),
    "wo": (None, "tp", "fsdp"),
    "w_gate": (None, "fsdp", "tp"),
    "w_up": (None, "fsdp", "tp"),
    "w_down": (None, "tp", "fsdp"),
}
JAX_INPUT_SPEC: tuple[str | None, ...] = ("fsdp", None, None)

EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"


def jax_param_shapes(size: LlamaSize) -> dict[str, tuple[int, ...]]:
    L, D, F = size.num_layers, size.hidden_size, size.ffn_size
    kv_width = size.num_kv_heads * size.head_size
    return {
        "attn_norm": (L, D),
        "mlp_norm": (L, D),
        "wq": (L, D, D),
        "wk": (L, D, kv_width),
        "wv": (L, D, kv_width),
        "wo": (L, D, D),
        "w_gate": (L, D, F),
        "w_up": (L, D, F),
        "w_down": (L, F, D),
    }


def jax_input_shape(size: LlamaSize) -> tuple[int, ...]:
    return (size.batch_size, size.seq_len, size.hidden_size)


def jax_abstract_inputs(case: Case, mesh: Any) -> tuple[dict[str, Any], Any]:
    """(params, x) as ShapeDtypeStructs carrying their NamedShardings: lowering allocates nothing."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    def abstract(shape: tuple[int, ...], spec: tuple[str | None, ...]) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, case.size.dtype, sharding=NamedSharding(mesh, PartitionSpec(*spec)))

    params = {k: abstract(shape, JAX_PARAM_SPECS[k]) for k, shape in jax_param_shapes(case.size).items()}
    return params, abstract(jax_input_shape(case.size), JAX_INPUT_SPEC)


def jax_train_step(case: Case) -> Any:
    """`train_step(params, x) -> (loss, grads)`: value_and_grad of a lax.scan over the stacked layers."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    size = case.size

    def rms_norm(x: Any, weight: Any, eps: float = 1e-6) -> Any:
        return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * weight

    def rope(t: Any) -> Any:
        # t: [batch, seq, heads, head_size]; rotate the two halves of each head by position-dependent angles.
        half = size.head_size // 2
        inv_freq = 1.0 / (10000.0 ** (jnp.arange(half, dtype=jnp.float32) / half))
        angles = jnp.arange(size.seq_len, dtype=jnp.float32)[:, None] * inv_freq[None, :]
        cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
        t1, t2 = t[..., :half], t[..., half:]
        return jnp.concatenate([t1 * cos - t2 * sin, t1 * sin + t2 * cos], axis=-1).astype(t.dtype)

    def attention(h: Any, p: dict[str, Any]) -> Any:
        b, s = h.shape[0], h.shape[1]
        q = (h @ p["wq"]).reshape(b, s, size.num_heads, size.head_size)
        k = (h @ p["wk"]).reshape(b, s, size.num_kv_heads, size.head_size)
        v = (h @ p["wv"]).reshape(b, s, size.num_kv_heads, size.head_size)
        q, k = rope(q), rope(k)
        if size.num_kv_heads != size.num_heads:
            k = jnp.repeat(k, size.num_heads // size.num_kv_heads, axis=2)
            v = jnp.repeat(v, size.num_heads // size.num_kv_heads, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(size.head_size))
        causal = jnp.tril(jnp.ones((s, s), dtype=bool))
        scores = jnp.where(causal, scores.astype(jnp.float32), jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, size.hidden_size)
        return out @ p["wo"]

    def layer(x: Any, p: dict[str, Any]) -> Any:
        x = x + attention(rms_norm(x, p["attn_norm"]), p)
        h = rms_norm(x, p["mlp_norm"])
        return x + (jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]

    def step(x: Any, p: dict[str, Any]) -> tuple[Any, None]:
        return layer(x, p), None

    if case.remat == "checkpoint":
        # Default policy saves nothing: the backward recomputes the whole layer from its input carry.
        step = jax.checkpoint(step)
    elif case.remat is not None:
        raise ValueError(f"remat={case.remat!r} has no JAX builder")

    def loss_fn(params: dict[str, Any], x: Any) -> Any:
        y, _ = lax.scan(step, x, params)
        return jnp.mean(y.astype(jnp.float32) ** 2)

    def train_step(params: dict[str, Any], x: Any) -> Any:
        return jax.value_and_grad(loss_fn)(params, x)

    return train_step


def example_llama_layers() -> Any:
    """The project's example model module (examples/ is a directory of scripts, not a package)."""
    if str(EXAMPLES_DIR) not in sys.path:
        sys.path.insert(0, str(EXAMPLES_DIR))
    import llama_layers

    return llama_layers


def torch_llama(case: Case, mesh: Any) -> tuple[Any, Any]:
    """(model, x) from the project's example layer stack, sharded as the example shards it."""
    import torch
    import torch_xla
    import torch_xla.distributed.spmd as xs

    example = example_llama_layers()
    size = case.size
    # The example layer has plain multi-head attention and no RoPE: heads are all the size it takes.
    if size.num_kv_heads != size.num_heads:
        raise ValueError(f"the example layer has no grouped-query attention (num_kv_heads={size.num_kv_heads})")
    torch.manual_seed(0)
    model = example.LlamaStack(size.num_layers, size.hidden_size, size.ffn_size, size.num_heads).to(torch_xla.device())
    example.shard_model(model, mesh)
    x = torch.randn(size.batch_size, size.seq_len, size.hidden_size).to(torch_xla.device())
    xs.mark_sharding(x, mesh, example.ACTIVATION_SPEC)
    return model, x

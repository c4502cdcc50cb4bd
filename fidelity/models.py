"""The JAX layer stacks (four families) with their parameter shardings, and the grid's original toy step.

`fidelity.steps` builds every case's whole training step around `jax_layer_stack`: the toy step here,
or a language model, a ViT, an optimizer, accumulation. Nothing here imports jax or torch at module
level: each runner configures XLA (device count, dump directory) through environment variables that
are read once, when the framework is first imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fidelity.cases import Case, ModelSize

# Stacked params [num_layers, ...]. Megatron-style 2D sharding on [in, out] weights: column-parallel
# projections shard `in` over fsdp and `out` over tp, the row-parallel ones the other way round; norms
# and the biases of row-parallel outputs stay replicated.
Spec = tuple[str | None, ...]
# Llama's attention block and its two norms, which the mixture-of-experts layer shares.
_ATTENTION_SPECS: dict[str, Spec] = {
    "attn_norm": (None, None),
    "mlp_norm": (None, None),
    "wq": (None, "fsdp", "tp"),
    "wk": (None, "fsdp", "tp"),
    "wv": (None, "fsdp", "tp"),
    "wo": (None, "tp", "fsdp"),
}
FAMILY_PARAM_SPECS: dict[str, dict[str, Spec]] = {
    "llama": {
        **_ATTENTION_SPECS,
        "w_gate": (None, "fsdp", "tp"),
        "w_up": (None, "fsdp", "tp"),
        "w_down": (None, "tp", "fsdp"),
    },
    "gpt2": {
        "ln1_scale": (None, None),
        "ln1_bias": (None, None),
        "w_qkv": (None, "fsdp", "tp"),
        "b_qkv": (None, "tp"),
        "w_proj": (None, "tp", "fsdp"),
        "b_proj": (None, None),
        "ln2_scale": (None, None),
        "ln2_bias": (None, None),
        "w_fc": (None, "fsdp", "tp"),
        "b_fc": (None, "tp"),
        "w_out": (None, "tp", "fsdp"),
        "b_out": (None, None),
    },
    "mlp": {
        "w_in": (None, "fsdp", "tp"),
        "b_in": (None, "tp"),
        "w_out": (None, "tp", "fsdp"),
        "b_out": (None, None),
    },
    # Experts split over the mesh's `expert` axis when it has one (expert parallelism); the attention
    # weights and the router are replicated over it, as the batch is split over it.
    "moe": {
        **_ATTENTION_SPECS,
        "router": (None, "fsdp", None),
        "w_in": (None, "expert", "fsdp", "tp"),
        "w_out": (None, "expert", "tp", "fsdp"),
    },
}


def jax_param_shapes(size: ModelSize, family: str = "llama") -> dict[str, tuple[int, ...]]:
    L, D, F = size.num_layers, size.hidden_size, size.ffn_size
    kv_width = size.num_kv_heads * size.head_size
    attention = {"wq": (L, D, D), "wk": (L, D, kv_width), "wv": (L, D, kv_width), "wo": (L, D, D)}
    if family == "llama":
        return {"attn_norm": (L, D), "mlp_norm": (L, D), **attention,
                "w_gate": (L, D, F), "w_up": (L, D, F), "w_down": (L, F, D)}  # fmt: skip
    if family == "gpt2":
        return {"ln1_scale": (L, D), "ln1_bias": (L, D), "w_qkv": (L, D, 3 * D), "b_qkv": (L, 3 * D),
                "w_proj": (L, D, D), "b_proj": (L, D), "ln2_scale": (L, D), "ln2_bias": (L, D),
                "w_fc": (L, D, F), "b_fc": (L, F), "w_out": (L, F, D), "b_out": (L, D)}  # fmt: skip
    if family == "mlp":
        return {"w_in": (L, D, F), "b_in": (L, F), "w_out": (L, F, D), "b_out": (L, D)}
    E = size.num_experts
    return {"attn_norm": (L, D), "mlp_norm": (L, D), **attention, "router": (L, D, E),
            "w_in": (L, E, D, F), "w_out": (L, E, F, D)}  # fmt: skip


def jax_input_shape(size: ModelSize) -> tuple[int, ...]:
    return (size.batch_size, size.seq_len, size.hidden_size)


def on_mesh(spec: Spec, axis_names: tuple[str, ...]) -> Spec:
    """A weight spec on a mesh without a tp (or fsdp, or expert) axis drops it."""
    return tuple(a if a is None or a in axis_names else None for a in spec)


def jax_specs(case: Case) -> tuple[dict[str, Spec], Spec]:
    """(layer param specs, toy input spec) on the case's mesh: the batch splits over the batch axes together."""
    axes = case.mesh.axis_names
    params = {k: on_mesh(v, axes) for k, v in FAMILY_PARAM_SPECS[case.family].items()}
    batch = case.mesh.batch_axes
    return params, ((batch if len(batch) > 1 else batch[0]), None, None)  # type: ignore[return-value]


def rms_norm(x: Any, weight: Any, eps: float = 1e-6) -> Any:
    import jax.numpy as jnp
    from jax import lax

    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def layer_norm(x: Any, scale: Any, bias: Any, eps: float = 1e-5) -> Any:
    import jax.numpy as jnp
    from jax import lax

    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * scale + bias


def jax_layer_stack(
    case: Case,
    constrain: Callable[[Any], Any] | None = None,
    positions: Any = None,
    segment_ids: Any = None,
    causal: bool = True,
) -> Callable[[Any, dict[str, Any]], Any]:
    """`stack(x, layer_params) -> y`: a lax.scan of the family's layer over the stacked params, remat as the case says.

    `constrain` is applied to the activations [batch, seq, hidden] after each residual add (sequence
    parallelism pins them there); `positions` [batch, seq] are RoPE's token positions (default
    0..seq-1, the same for every row); `segment_ids` [batch, seq] keep attention within each packed
    sequence; `causal=False` lets every token attend to every other (ViT).
    """
    import jax
    import jax.numpy as jnp
    from jax import lax

    size = case.size
    keep = constrain or (lambda x: x)

    def rope(t: Any) -> Any:
        # t: [batch, seq, heads, head_size]; rotate the two halves of each head by position-dependent angles.
        half = size.head_size // 2
        inv_freq = 1.0 / (10000.0 ** (jnp.arange(half, dtype=jnp.float32) / half))
        if positions is None:
            angles = jnp.arange(size.seq_len, dtype=jnp.float32)[:, None] * inv_freq[None, :]
            cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
        else:
            angles = positions.astype(jnp.float32)[..., None] * inv_freq
            cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
        t1, t2 = t[..., :half], t[..., half:]
        return jnp.concatenate([t1 * cos - t2 * sin, t1 * sin + t2 * cos], axis=-1).astype(t.dtype)

    def attention(q: Any, k: Any, v: Any) -> Any:
        b, s = q.shape[0], q.shape[1]
        if k.shape[2] != q.shape[2]:
            k = jnp.repeat(k, q.shape[2] // k.shape[2], axis=2)
            v = jnp.repeat(v, q.shape[2] // v.shape[2], axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(size.head_size))
        if causal:
            mask = jnp.tril(jnp.ones((s, s), dtype=bool))
            if segment_ids is not None:
                # [batch, 1, q, k]: a token sees the earlier tokens of its own sequence.
                mask = (mask[None] & (segment_ids[:, :, None] == segment_ids[:, None, :]))[:, None]
            scores = jnp.where(mask, scores.astype(jnp.float32), jnp.finfo(jnp.float32).min)
        else:
            scores = scores.astype(jnp.float32)
        probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        return jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, size.hidden_size)

    def llama_attention(h: Any, p: dict[str, Any]) -> Any:
        b, s = h.shape[0], h.shape[1]
        q = (h @ p["wq"]).reshape(b, s, size.num_heads, size.head_size)
        k = (h @ p["wk"]).reshape(b, s, size.num_kv_heads, size.head_size)
        v = (h @ p["wv"]).reshape(b, s, size.num_kv_heads, size.head_size)
        return attention(rope(q), rope(k), v) @ p["wo"]

    def moe_ffn(h: Any, p: dict[str, Any]) -> Any:
        # Token-choice top-k routing, dense dispatch: every expert sees every token, weighted by its gate.
        gates = jax.nn.softmax((h @ p["router"]).astype(jnp.float32), axis=-1)
        top, index = lax.top_k(gates, size.top_k)
        weights = jnp.sum(jax.nn.one_hot(index, size.num_experts) * top[..., None], axis=-2).astype(h.dtype)
        hidden = jax.nn.silu(jnp.einsum("bsd,edf->bsef", h, p["w_in"]))
        out = jnp.einsum("bsef,efd->bsed", hidden, p["w_out"])
        return jnp.einsum("bsed,bse->bsd", out, weights)

    def layer(x: Any, p: dict[str, Any]) -> Any:
        if case.family == "llama":
            x = keep(x + llama_attention(rms_norm(x, p["attn_norm"]), p))
            h = rms_norm(x, p["mlp_norm"])
            return keep(x + (jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"])
        if case.family == "gpt2":
            b, s = x.shape[0], x.shape[1]
            h = layer_norm(x, p["ln1_scale"], p["ln1_bias"])
            qkv = (h @ p["w_qkv"] + p["b_qkv"]).reshape(b, s, 3, size.num_heads, size.head_size)
            x = keep(x + attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]) @ p["w_proj"] + p["b_proj"])
            h = layer_norm(x, p["ln2_scale"], p["ln2_bias"])
            return keep(x + jax.nn.gelu(h @ p["w_fc"] + p["b_fc"]) @ p["w_out"] + p["b_out"])
        if case.family == "mlp":
            return keep(x + jax.nn.relu(x @ p["w_in"] + p["b_in"]) @ p["w_out"] + p["b_out"])
        x = keep(x + llama_attention(rms_norm(x, p["attn_norm"]), p))
        return keep(x + moe_ffn(rms_norm(x, p["mlp_norm"]), p))

    def step(x: Any, p: dict[str, Any]) -> tuple[Any, None]:
        return layer(x, p), None

    if case.remat == "full":
        # Default policy saves nothing: the backward recomputes the whole layer from its input carry.
        step = jax.checkpoint(step)
    elif case.remat == "dots":
        # Matmuls without batch dims (the projections) are saved; attention's and the rest are recomputed.
        step = jax.checkpoint(step, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    elif case.remat is not None:
        raise ValueError(f"remat={case.remat!r} has no JAX builder")

    def stack(x: Any, layer_params: dict[str, Any]) -> Any:
        y, _ = lax.scan(step, x, layer_params)
        return y

    return stack


def jax_toy_loss(case: Case) -> Callable[[dict[str, Any], Any], Any]:
    """`loss(params, x)`: mean(y**2) in f32 after the layer stack."""
    import jax.numpy as jnp

    stack = jax_layer_stack(case)

    def loss_fn(params: dict[str, Any], x: Any) -> Any:
        return jnp.mean(stack(x, params).astype(jnp.float32) ** 2)

    return loss_fn


def jax_toy_step(case: Case) -> Any:
    """`train_step(params, x) -> (loss, grads)`: value_and_grad of the toy loss."""
    import jax

    loss_fn = jax_toy_loss(case)

    def train_step(params: dict[str, Any], x: Any) -> Any:
        return jax.value_and_grad(loss_fn)(params, x)

    return train_step

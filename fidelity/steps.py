"""A JAX case's whole training step: its arguments with their shardings, its jit options and its function.

The toy step is `models.jax_toy_step` (with microbatches, its loss accumulated as below). The others
wrap the layer stack in what users train:
- a language model: int32 tokens [batch, seq + 1] (inputs and targets are the two shifted views), the
  embedding gathered per token, the stack, a final norm, the head (or the embedding's transpose when
  tied), cross-entropy in f32; with packing, segment ids and positions come with the tokens;
- a ViT: images [batch, side, side, 3] cut into 16x16 patches by a strided convolution, the gpt2 stack
  without a causal mask, a final LayerNorm, mean pooling, a classifier;
- around either: value_and_grad, or an outer lax.scan over microbatches accumulating f32 gradients;
  then AdamW (hand-written, as optax's adamw computes it) with params and state donated.
"""

from __future__ import annotations

import math
from typing import Any

from fidelity.cases import Case
from fidelity.models import (
    FAMILY_PARAM_SPECS,
    Spec,
    jax_input_shape,
    jax_layer_stack,
    jax_param_shapes,
    jax_specs,
    jax_toy_loss,
    jax_toy_step,
    layer_norm,
    on_mesh,
    rms_norm,
)

VIT_PATCH = 16
VIT_CHANNELS = 3
LEARNING_RATE, BETA1, BETA2, EPSILON, WEIGHT_DECAY = 3e-4, 0.9, 0.95, 1e-8, 0.1
MAX_GRAD_NORM = 1.0
Z_LOSS_WEIGHT = 1e-4

# Everything around the stack. The embedding [vocab, hidden] shards as MaxText shards it (vocab over
# tp, hidden over fsdp) and the head [hidden, vocab] as a column-parallel projection; a tied head is
# the embedding's transpose, so both views agree. Norms and biases are replicated.
HEAD_SPECS: dict[str, Spec] = {
    "embed": ("tp", "fsdp"),
    "pos_embed": (None, "fsdp"),
    "patch_embed": (None, None, None, "tp"),
    "patch_bias": ("tp",),
    "final_norm": (None,),
    "final_norm_bias": (None,),
    "head": ("fsdp", "tp"),
    "classifier": ("fsdp", None),
}


def head_param_shapes(case: Case) -> dict[str, tuple[int, ...]]:
    """The parameters outside the layer stack, by step and family (GPT-2 learns positions, LayerNorm has a bias)."""
    s = case.size
    D, V = s.hidden_size, s.vocab_size
    if case.step == "toy":
        return {}
    if case.step == "vit":
        return {"patch_embed": (VIT_PATCH, VIT_PATCH, VIT_CHANNELS, D), "patch_bias": (D,), "pos_embed": (s.seq_len, D),
                "final_norm": (D,), "final_norm_bias": (D,), "classifier": (D, V)}  # fmt: skip
    shapes: dict[str, tuple[int, ...]] = {"embed": (V, D)}
    if case.family == "gpt2":
        shapes |= {"pos_embed": (s.seq_len, D), "final_norm": (D,), "final_norm_bias": (D,)}
    else:
        shapes["final_norm"] = (D,)
    if case.step == "lm":
        shapes["head"] = (D, V)
    return shapes


def batch_shapes(case: Case) -> dict[str, tuple[tuple[int, ...], str]]:
    """The step's batch: {name: (shape, dtype)}."""
    s = case.size
    if case.step == "vit":
        side = math.isqrt(s.seq_len) * VIT_PATCH
        return {"images": ((s.batch_size, side, side, VIT_CHANNELS), s.dtype), "labels": ((s.batch_size,), "int32")}
    names = ("tokens", "segment_ids", "positions") if case.packed else ("tokens",)
    return {name: ((s.batch_size, s.seq_len + 1), "int32") for name in names}


def arg_names(case: Case) -> tuple[str, ...]:
    if case.step == "toy":
        return ("params", "x")
    return ("params", "opt_state", "batch") if case.optimizer else ("params", "batch")


def output_names(case: Case) -> tuple[str, ...]:
    return ("params", "opt_state", "loss") if case.optimizer else ("loss", "grads")


def _batch_axis(case: Case) -> Any:
    batch = case.mesh.batch_axes
    return batch if len(batch) > 1 else batch[0]


def state_dtype(case: Case) -> str:
    """AdamW's moments (and master copy): f32 under mixed precision, else the params' dtype."""
    return "float32" if case.mixed_precision else case.size.dtype


def abstract_args(case: Case, mesh: Any) -> tuple[Any, ...]:
    """The step's arguments as ShapeDtypeStructs carrying their NamedShardings: lowering allocates nothing."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    def abstract(shape: tuple[int, ...], spec: Spec, dtype: str) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, PartitionSpec(*spec)))

    axes = case.mesh.axis_names
    layer_specs, x_spec = jax_specs(case)
    specs = layer_specs | {k: on_mesh(v, axes) for k, v in HEAD_SPECS.items()}
    shapes = jax_param_shapes(case.size, case.family) | head_param_shapes(case)
    params = {k: abstract(shape, specs[k], case.size.dtype) for k, shape in shapes.items()}
    if case.step == "toy":
        return params, abstract(jax_input_shape(case.size), x_spec, case.size.dtype)
    batch_axis = _batch_axis(case)
    batch = {k: abstract(shape, (batch_axis,) + (None,) * (len(shape) - 1), dtype)
             for k, (shape, dtype) in batch_shapes(case).items()}  # fmt: skip
    if not case.optimizer:
        return params, batch

    def like(dtype: str) -> dict[str, Any]:
        return {k: abstract(p.shape, specs[k], dtype) for k, p in params.items()}

    state = {"count": abstract((), (), "int32"), "m": like(state_dtype(case)), "v": like(state_dtype(case))}
    if case.mixed_precision == "f32_master":
        state["master"] = like("float32")
    return params, state, batch


def jit_options(case: Case, mesh: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    """`jit`'s out_shardings and donation: an optimizer step donates params and state and returns them
    sharded as they came; a gradient step pins its gradients to the params' shardings, or leaves
    them to XLA."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    def shardings(tree: Any) -> Any:
        return jax.tree.map(lambda a: a.sharding, tree)

    replicated = NamedSharding(mesh, PartitionSpec())
    if case.optimizer:
        return {"out_shardings": (shardings(args[0]), shardings(args[1]), replicated), "donate_argnums": (0, 1)}
    if case.pinned:
        return {"out_shardings": (replicated, shardings(args[0]))}
    return {}


def train_step(case: Case, mesh: Any) -> Any:
    """The case's step function, for `jax.jit(..., **jit_options(...))`."""
    if case.step == "toy" and case.microbatches == 1:
        return jax_toy_step(case)
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    batch_axis = _batch_axis(case)
    if case.step == "toy":
        loss_fn = jax_toy_loss(case)
    else:
        loss_fn = _vit_loss(case) if case.step == "vit" else _lm_loss(case, mesh)

    def gradients(params: dict[str, Any], batch: dict[str, Any]) -> tuple[Any, Any]:
        if case.microbatches == 1:
            return jax.value_and_grad(loss_fn)(params, batch)
        k = case.microbatches

        def split(a: Any) -> Any:
            # [batch, ...] -> [k, batch / k, ...], each microbatch split over the batch axes as the batch was.
            a = a.reshape(k, a.shape[0] // k, *a.shape[1:])
            spec = PartitionSpec(None, batch_axis, *(None,) * (a.ndim - 2))
            return jax.lax.with_sharding_constraint(a, NamedSharding(mesh, spec))

        def accumulate(carry: Any, microbatch: Any) -> tuple[Any, None]:
            loss_sum, grad_sum = carry
            loss, grads = jax.value_and_grad(loss_fn)(params, microbatch)
            return (loss_sum + loss, jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grad_sum, grads)), None

        zeros = (jnp.zeros((), jnp.float32), jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params))
        (loss_sum, grad_sum), _ = jax.lax.scan(accumulate, zeros, jax.tree.map(split, batch))
        return loss_sum / k, jax.tree.map(lambda g: g / k, grad_sum)

    if not case.optimizer:
        return gradients

    def step(params: dict[str, Any], opt_state: dict[str, Any], batch: dict[str, Any]) -> Any:
        loss, grads = gradients(params, batch)
        new_params, new_state = _adamw(case, params, grads, opt_state)
        return new_params, new_state, loss

    return step


def _layer_params(case: Case, params: dict[str, Any]) -> dict[str, Any]:
    return {k: params[k] for k in FAMILY_PARAM_SPECS[case.family]}


def _cross_entropy(case: Case, logits: Any, targets: Any) -> Any:
    """Per-token negative log-likelihood in f32 (plus z-loss), in the case's spelling."""
    import jax
    import jax.numpy as jnp

    logits = logits.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    if case.cross_entropy == "take_along_axis":
        nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    else:
        nll = -jnp.sum(jax.nn.one_hot(targets, logits.shape[-1], dtype=jnp.float32) * log_probs, axis=-1)
    if case.z_loss:
        nll = nll + Z_LOSS_WEIGHT * jnp.square(jax.nn.logsumexp(logits, axis=-1))
    return nll


def _lm_loss(case: Case, mesh: Any) -> Any:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    constrain = None
    if case.seq_parallel:
        # Megatron's sequence parallelism: between sublayers the activations are split over tp by sequence.
        spec = NamedSharding(mesh, PartitionSpec(_batch_axis(case), "tp", None))

        def constrain(x: Any) -> Any:
            return jax.lax.with_sharding_constraint(x, spec)

    def loss_fn(params: dict[str, Any], batch: dict[str, Any]) -> Any:
        tokens = batch["tokens"]
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        positions = segments = None
        if case.packed:
            positions = batch["positions"][:, :-1]
            segments, next_segments = batch["segment_ids"][:, :-1], batch["segment_ids"][:, 1:]
        x = params["embed"][inputs]
        if case.family == "gpt2":
            x = x + (params["pos_embed"][positions] if positions is not None else params["pos_embed"][None])
        if constrain is not None:
            x = constrain(x)
        # GPT-2 learns absolute positions; the RoPE families rotate by the packed positions.
        rope_positions = positions if case.family != "gpt2" else None
        stack = jax_layer_stack(case, constrain, rope_positions, segments)
        y = stack(x, _layer_params(case, params))
        if case.family == "gpt2":
            h = layer_norm(y, params["final_norm"], params["final_norm_bias"])
        else:
            h = rms_norm(y, params["final_norm"])
        head = params["embed"].T if case.step == "lm_tied" else params["head"]
        nll = _cross_entropy(case, h @ head, targets)
        if segments is None:
            return jnp.mean(nll)
        # Label masking: no loss on padding (segment 0) or across a document boundary.
        weights = ((next_segments != 0) & (next_segments == segments)).astype(jnp.float32)
        return jnp.sum(nll * weights) / jnp.maximum(jnp.sum(weights), 1.0)

    return loss_fn


def _vit_loss(case: Case) -> Any:
    import jax.numpy as jnp
    from jax import lax

    stack = jax_layer_stack(case, causal=False)

    def loss_fn(params: dict[str, Any], batch: dict[str, Any]) -> Any:
        images = batch["images"]
        patches = lax.conv_general_dilated(images, params["patch_embed"], (VIT_PATCH, VIT_PATCH), "VALID",
                                           dimension_numbers=("NHWC", "HWIO", "NHWC"))  # fmt: skip
        b, gh, gw, d = patches.shape
        x = (patches + params["patch_bias"]).reshape(b, gh * gw, d) + params["pos_embed"][None]
        y = stack(x, _layer_params(case, params))
        pooled = jnp.mean(layer_norm(y, params["final_norm"], params["final_norm_bias"]), axis=1)
        return jnp.mean(_cross_entropy(case, pooled @ params["classifier"], batch["labels"]))

    return loss_fn


def _decays(name: str) -> bool:
    """Weight decay on the matrices, not on norms, biases or position tables (the usual mask)."""
    return not ("norm" in name or name.startswith(("ln", "b_")) or name.endswith("bias") or name == "pos_embed")


def _adamw(case: Case, params: dict[str, Any], grads: dict[str, Any], state: dict[str, Any]) -> tuple[Any, Any]:
    """One AdamW update, bias-corrected, decoupled weight decay, in the state's dtype."""
    import jax.numpy as jnp

    dtype = jnp.dtype(state_dtype(case))
    count = state["count"] + 1
    if case.optimizer == "adamw_clip":
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in grads.values()))
        scale = jnp.minimum(1.0, MAX_GRAD_NORM / (norm + 1e-6))
        grads = {k: (g * scale).astype(g.dtype) for k, g in grads.items()}
    t = count.astype(jnp.float32)
    correction1, correction2 = 1 - BETA1**t, 1 - BETA2**t
    new_params, m_new, v_new, master_new = {}, {}, {}, {}
    for k, p in params.items():
        g = grads[k].astype(dtype)
        m = BETA1 * state["m"][k] + (1 - BETA1) * g
        v = BETA2 * state["v"][k] + (1 - BETA2) * g * g
        update = (m / correction1.astype(dtype)) / (jnp.sqrt(v / correction2.astype(dtype)) + EPSILON)
        base = state["master"][k] if case.mixed_precision == "f32_master" else p.astype(dtype)
        if _decays(k):
            update = update + WEIGHT_DECAY * base
        updated = base - LEARNING_RATE * update
        new_params[k], m_new[k], v_new[k] = updated.astype(p.dtype), m.astype(dtype), v.astype(dtype)
        master_new[k] = updated
    new_state: dict[str, Any] = {"count": count, "m": m_new, "v": v_new}
    if case.mixed_precision == "f32_master":
        new_state["master"] = master_new
    return new_params, new_state

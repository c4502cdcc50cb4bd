"""Train a Llama-like layer stack scanned with `jax.lax.scan` on 8 virtual CPU devices, planned by the JAX client.

    .venv/bin/python examples/train_llama_scan_jax.py [--partitioner gspmd|shardy] [--steps 3] [--url URL] [--json]

The weights are stacked `[layers, ...]` and sharded FSDP x TP (mesh fsdp=4, tp=2) with the usual 2D specs;
the step returns its gradients with no sharding asked for, so XLA's propagation decides them. `plan_step`
lowers the step from abstract inputs (nothing allocated), plans it in process (or at --url) and makes the
plan active; `scan` then pins each layer's weights, and through them their gradients, as planned. The
script compiles the gradient step plain and planned, prints the gradients' shardings XLA chose next to the
planned ones and the HBM per device XLA:CPU measures next to the prediction, and trains a few SGD steps.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

# Appended, not defaulted: XLA_FLAGS may already hold other flags (importing torch_xla sets one), and
# without the device count the host platform has a single device.
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from scan_runtime.jax import plan_step, scan, use_plan

LAYERS, DIM, HIDDEN, HEADS, BATCH, SEQ = 4, 512, 2048, 8, 8, 128
# Per stacked weight: the layer dim whole, then FSDP x TP as a Megatron-style layer splits them.
SPECS = {"attn_norm": P(None, None), "wq": P(None, "fsdp", "tp"), "wk": P(None, "fsdp", "tp"),
         "wv": P(None, "fsdp", "tp"), "wo": P(None, "tp", "fsdp"), "mlp_norm": P(None, None),
         "w_gate": P(None, "fsdp", "tp"), "w_up": P(None, "fsdp", "tp"), "w_down": P(None, "tp", "fsdp")}  # fmt: skip
SHAPES = {"attn_norm": (LAYERS, DIM), "wq": (LAYERS, DIM, DIM), "wk": (LAYERS, DIM, DIM), "wv": (LAYERS, DIM, DIM),
          "wo": (LAYERS, DIM, DIM), "mlp_norm": (LAYERS, DIM), "w_gate": (LAYERS, DIM, HIDDEN),
          "w_up": (LAYERS, DIM, HIDDEN), "w_down": (LAYERS, HIDDEN, DIM)}  # fmt: skip
BATCH_SPEC = P("fsdp", None, None)
LEARNING_RATE = 10.0  # the loss is a mean over 4M values: its gradients are small


def rms_norm(x: Any, weight: Any) -> Any:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * weight


def make_layer(head_size: int) -> Any:
    """One Llama-like layer (RMSNorm, causal attention, SwiGLU MLP) for `lax.scan`; sizes from its weights."""

    def layer(x: Any, p: dict[str, Any]) -> tuple[Any, None]:
        b, s, dim = x.shape
        h = rms_norm(x, p["attn_norm"])
        q, k, v = ((h @ p[w]).reshape(b, s, dim // head_size, head_size) for w in ("wq", "wk", "wv"))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(jnp.float32(head_size))
        scores = jnp.where(jnp.tril(jnp.ones((s, s), dtype=bool)), scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(v.dtype)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, dim) @ p["wo"]
        h = rms_norm(x, p["mlp_norm"])
        return x + (jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"], None

    return layer


layer = make_layer(DIM // HEADS)


def loss_fn(params: dict[str, Any], x: Any) -> Any:
    y, _ = scan(layer, x, params["layers"])  # the drop-in: jax.lax.scan plus the active plan's pins
    return jnp.mean(y * y)


def abstract_inputs(mesh: Mesh) -> tuple[Any, Any]:
    params = {"layers": {name: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, SPECS[name]))
                         for name, shape in SHAPES.items()}}  # fmt: skip
    x = jax.ShapeDtypeStruct((BATCH, SEQ, DIM), jnp.float32, sharding=NamedSharding(mesh, BATCH_SPEC))
    return params, x


def compiled_gradients(params: Any, x: Any) -> tuple[dict[str, Any], int]:
    """XLA's shardings of the step's gradients (a spec per parameter path) and its bytes per device."""
    compiled = jax.jit(jax.value_and_grad(loss_fn)).lower(params, x).compile()
    stats = compiled.memory_analysis()
    total = stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
    shardings = jax.tree_util.tree_flatten_with_path(compiled.output_shardings[1])[0]
    leaves = dict(jax.tree_util.tree_flatten_with_path(params)[0])
    specs = {}
    for path, sharding in shardings:
        ndim = len(leaves[path].shape)
        specs[jax.tree_util.keystr(path)] = _spec_of(sharding, ndim)
    return specs, int(total - stats.alias_size_in_bytes)


def _spec_of(sharding: Any, ndim: int) -> list[Any]:
    return _entries(getattr(sharding, "spec", P()), ndim)


def _entries(spec: Any, ndim: int) -> list[Any]:
    """A PartitionSpec as JSON: one entry per dim (None, an axis, or a list of axes)."""
    entries = [list(a) if isinstance(a, tuple) else a for a in spec]
    return entries + [None] * (ndim - len(entries))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitioner", choices=("gspmd", "shardy"), default="gspmd")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--url", help="planner service; default: plan in-process")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON line")
    args = ap.parse_args()

    jax.config.update("jax_use_shardy_partitioner", args.partitioner == "shardy")
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("fsdp", "tp"))
    params, x = abstract_inputs(mesh)

    with use_plan(None):
        plain_specs, plain_bytes = compiled_gradients(params, x)
    client = None
    if args.url:
        from scan_runtime import PlannerClient

        client = PlannerClient(url=args.url, mesh=mesh, hbm_bytes=32 << 30)
    plan = plan_step(loss_fn, params, x, mesh=mesh, hbm_bytes=32 << 30, client=client)
    assert plan is not None and plan.plan is not None
    # The stacked gradient of a pinned parameter: the layer dim whole, each layer as planned.
    planned = {name: [None, *_entries(spec, len(plan.parameters[name]) - 1)] for name, spec in plan.layer_specs.items()}
    specs, xla_bytes = compiled_gradients(params, x)

    # A few SGD steps on real arrays, with the plan active.
    keys = jax.random.split(jax.random.PRNGKey(0), len(SHAPES) + 1)
    weights = {"layers": {name: jax.device_put(0.02 * jax.random.normal(k, shape), NamedSharding(mesh, SPECS[name]))
                          for k, (name, shape) in zip(keys, SHAPES.items())}}  # fmt: skip
    batch = jax.device_put(jax.random.normal(keys[-1], (BATCH, SEQ, DIM)), NamedSharding(mesh, BATCH_SPEC))

    @jax.jit
    def sgd(weights: Any, batch: Any) -> tuple[Any, Any]:
        loss, grads = jax.value_and_grad(loss_fn)(weights, batch)
        return loss, jax.tree_util.tree_map(lambda w, g: w - LEARNING_RATE * g, weights, grads)

    losses = []
    for _ in range(args.steps):
        loss, weights = sgd(weights, batch)
        losses.append(float(loss))

    result = {
        "partitioner": args.partitioner,
        "plan_id": plan.plan_id,
        "plan_partitioner": plan.plan.partitioner,
        "predicted_before_bytes": plan.plan.hbm.total_before,
        "predicted_after_bytes": plan.plan.hbm.total_after,
        "xla_before_bytes": plain_bytes,
        "xla_after_bytes": xla_bytes,
        "planned_specs": planned,
        "gradient_specs_before": plain_specs,
        "gradient_specs_after": specs,
        "parameter_specs": {f"['layers']['{n}']": _entries(spec, len(SHAPES[n])) for n, spec in SPECS.items()},
        "losses": losses,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    mib = 1 << 20
    print(f"plan {plan.plan_id} ({args.partitioner}; {plan.plan.partitioner})")
    for name, spec in planned.items():
        print(f"  {name:22s} planned {spec}  XLA before {plain_specs[name]}  after {specs[name]}")
    hbm = plan.plan.hbm
    print(f"HBM per device, predicted {hbm.total_before / mib:.1f} -> {hbm.total_after / mib:.1f} MiB; "
          f"XLA:CPU {plain_bytes / mib:.1f} -> {xla_bytes / mib:.1f} MiB")  # fmt: skip
    print("losses " + ", ".join(f"{v:.6f}" for v in losses))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A step builder for `spmd-planner search`: the Llama-like stack of train_llama_scan_jax.py per configuration.

    .venv/bin/spmd-planner search search_llama_jax:build --devices 8 --axes fsdp,tp --remat none,full \\
        --microbatches 1,2 --chip v6e --top 2          # from examples/ (the builder must import)
    .venv/bin/spmd-planner search search_llama_jax:build_405b --devices 256 --remat none,full --top 3

`build(candidate, mesh)` returns the step for one candidate: the layer remat'ed as `candidate.remat` says
(`full`: `jax.checkpoint`, the backward recomputes each layer), and a batch of `GLOBAL_BATCH //
candidate.microbatches` rows (the step of one microbatch; the accumulation over microbatches is the
training loop's). Inputs are abstract: nothing is allocated.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from train_llama_scan_jax import BATCH_SPEC, DIM, SEQ, SHAPES, SPECS, layer, make_layer

from planner.search.candidates import Candidate
from scan_runtime.jax import scan

GLOBAL_BATCH = 16


def build(candidate: Candidate, mesh: Any) -> tuple[Any, Any, tuple[Any, ...]]:
    if candidate.remat not in (None, "full"):
        raise ValueError(f"remat={candidate.remat!r}: this builder knows none and full")
    if GLOBAL_BATCH % candidate.microbatches:
        raise ValueError(f"{candidate.microbatches} microbatches do not divide the batch of {GLOBAL_BATCH}")

    def loss_fn(params: dict[str, Any], x: Any) -> Any:
        # The client checkpoints the layer with the plan's pins inside (`remat=`), so that the backward reads
        # the scanned weights rather than a kept copy of each pinned slice.
        y, _ = scan(layer, x, params["layers"], remat=candidate.remat == "full")
        return jnp.mean(y * y)

    params = {"layers": {name: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, SPECS[name]))
                         for name, shape in SHAPES.items()}}  # fmt: skip
    rows = GLOBAL_BATCH // candidate.microbatches
    x = jax.ShapeDtypeStruct((rows, SEQ, DIM), jnp.float32, sharding=NamedSharding(mesh, BATCH_SPEC))
    return loss_fn, params, (x,)


# Llama 3.1 405B's layer sizes (MHA here where Llama uses 8 KV heads), bf16, 2,048-token sequences.
LAYERS_405B, DIM_405B, HIDDEN_405B, HEAD_SIZE_405B, SEQ_405B, GLOBAL_BATCH_405B = 126, 16384, 53248, 128, 2048, 256


def build_405b(candidate: Candidate, mesh: Any) -> tuple[Any, Any, tuple[Any, ...]]:
    """The same stack at Llama-3.1-405B's sizes: 126 layers of 16,384 x 53,248, for a v6e-256 search."""
    if candidate.remat not in (None, "full"):
        raise ValueError(f"remat={candidate.remat!r}: this builder knows none and full")
    if GLOBAL_BATCH_405B % candidate.microbatches:
        raise ValueError(f"{candidate.microbatches} microbatches do not divide the batch of {GLOBAL_BATCH_405B}")
    one = make_layer(HEAD_SIZE_405B)

    def loss_fn(params: dict[str, Any], x: Any) -> Any:
        y, _ = scan(one, x, params["layers"], remat=candidate.remat == "full")
        return jnp.mean(jnp.square(y.astype(jnp.float32)))

    d, f = DIM_405B, HIDDEN_405B
    shapes = {"attn_norm": (d,), "wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d), "mlp_norm": (d,),
              "w_gate": (d, f), "w_up": (d, f), "w_down": (f, d)}  # fmt: skip
    params = {"layers": {name: jax.ShapeDtypeStruct((LAYERS_405B, *shape), jnp.bfloat16,
                                                    sharding=NamedSharding(mesh, SPECS[name]))
                         for name, shape in shapes.items()}}  # fmt: skip
    rows = GLOBAL_BATCH_405B // candidate.microbatches
    x = jax.ShapeDtypeStruct((rows, SEQ_405B, d), jnp.bfloat16, sharding=NamedSharding(mesh, BATCH_SPEC))
    return loss_fn, params, (x,)

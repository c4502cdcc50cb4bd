"""Small real modules in every text form the installed JAX and its XLA write, for the parser's tests.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m fidelity.syntax_fixtures OUT_DIR

One step exercises what newer printers write and older ones did not: a scan (a While whose body reads
its tuple's elements: `%t#k` operands in XLA's dump), a shard_map with a psum and an all_gather
(manual axes, all-reduces' replica groups), `lax.top_k`, an open dim (`P.UNCONSTRAINED`), a sub-axis
(a dim split over part of an axis), a boolean mask constant. Each partitioner's module is written as
`lowered.as_text()` (StableHLO), `lowered.as_text(dialect="hlo")` and XLA:CPU's `before_optimizations`
dump, with the compiled bytes and per-device While shapes XLA reported, and as the HLO this release's
jaxlib converts its StableHLO to (`.stablehlo.hlo`).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from fidelity.dumps import largest_module, while_shapes
from planner.hlo.text import jaxlib_api

NAME = "syntax_step"
WINDOW = 4  # the sliding window of the step's boolean mask constant


def _step() -> tuple[Any, tuple[Any, ...], Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("fsdp", "tp"))
    num_layers, hidden, seq = 3, 64, 16

    def layer(x: Any, w: Any) -> tuple[Any, None]:
        h = jnp.tanh(x @ w)
        h = jax.lax.with_sharding_constraint(h, NamedSharding(mesh, P("fsdp", P.UNCONSTRAINED)))
        return x + h, None

    def summed(block: Any) -> Any:
        total = jax.lax.psum(block, "tp")  # [B/2, H/4], the same on every tp device
        return jax.lax.psum(total, "fsdp")  # the same everywhere

    shard_sum = jax.shard_map(summed, mesh=mesh, in_specs=P("fsdp", "tp"), out_specs=P(None, None))

    def step(ws: Any, x: Any) -> Any:
        def loss(ws: Any) -> Any:
            y, _ = jax.lax.scan(layer, x, ws)
            # A sliding-window causal mask as a constant (Gemma 2's local layers): a dense i1 tensor in hex.
            causal = np.tril(np.ones((seq, seq), dtype=bool))
            mask = jnp.asarray(causal & ~np.tril(causal, -WINDOW))
            scores = jnp.where(mask, y[:seq, :seq], -1e9)
            top, _ = jax.lax.top_k(scores, 4)
            return top.mean() + shard_sum(y).mean()

        return jax.value_and_grad(loss)(ws)

    ws = jax.ShapeDtypeStruct((num_layers, hidden, hidden), jnp.float32,
                              sharding=NamedSharding(mesh, P(None, "fsdp", "tp")))  # fmt: skip
    # A dim split over tp's minor half only: a sub-axis in Shardy's terms.
    x = jax.ShapeDtypeStruct((seq * 4, hidden), jnp.float32, sharding=NamedSharding(mesh, P(("fsdp", "tp"), None)))
    return jax.jit(step), (ws, x), mesh


def write_forms(out_dir: Path) -> dict[str, Any]:
    import jax

    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"jax": jax.__version__}
    dump_root = Path(os.environ["SYNTAX_DUMP_DIR"])
    for partitioner in ("gspmd", "shardy"):
        jax.config.update("jax_use_shardy_partitioner", partitioner == "shardy")
        fn, args, _ = _step()
        lowered = fn.lower(*args)
        stem = f"{NAME}_{partitioner}"
        (out_dir / f"{stem}.stablehlo.mlir").write_text(lowered.as_text())
        (out_dir / f"{stem}.lowered.hlo").write_text(lowered.as_text(dialect="hlo"))
        # The HLO this release's own jaxlib converts the StableHLO to, every attribute printed: what another
        # release's jaxlib must read the StableHLO text as.
        converted = jaxlib_api.stablehlo_to_computation(lowered.as_text())
        (out_dir / f"{stem}.stablehlo.hlo").write_text(jaxlib_api.short_parsable_text(converted, False))
        compiled = lowered.compile()
        module = largest_module(dump_root, exclude=tuple(summary.get("prefixes", [])))
        summary.setdefault("prefixes", []).append(module.prefix)
        (out_dir / f"{stem}.xla_dump.hlo").write_text(module.before_optimizations.read_text())
        stats = compiled.memory_analysis()
        summary[partitioner] = {
            "total_bytes": int(
                stats.argument_size_in_bytes
                + stats.output_size_in_bytes
                + stats.temp_size_in_bytes
                - stats.alias_size_in_bytes
            ),
            "post_partition_while_shapes": while_shapes(module.after_spmd_partitioning.read_text()),
        }
    summary.pop("prefixes")
    (out_dir / f"{NAME}.xla.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    dump = tempfile.mkdtemp(prefix="syntax-fixtures-")
    os.environ["SYNTAX_DUMP_DIR"] = dump
    flags = os.environ.get("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    os.environ["XLA_FLAGS"] = (
        f"{flags} --xla_dump_to={dump} --xla_dump_hlo_as_text --xla_dump_hlo_pass_re=spmd-partitioning"
    )
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    print(json.dumps(write_forms(Path(args[0])), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

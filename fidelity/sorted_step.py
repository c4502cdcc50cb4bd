"""A small real step that sorts inside its scan, lowered by the installed JAX, for verify's tests.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m fidelity.sorted_step OUT_DIR

A sort's comparator is where the releases' HLO text differs in a form the older XLA parser refuses:
jax 0.12 writes its total order as `compare(a, b), direction=LT, order=TOTAL`, jax 0.7.1 as
`type=TOTALORDER`. The step is otherwise what the planner plans: two layers' stacked weights split
over fsdp and tp, scanned, with their gradient. Writes `sorted_step.lowered.hlo`
(`lowered.as_text(dialect="hlo")`, the form a user hands over) and prints the jax release that wrote it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

NAME = "sorted_step"


def _step() -> tuple[Any, tuple[Any, ...]]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("fsdp", "tp"))
    num_layers, hidden, batch = 2, 32, 16

    def layer(x: Any, w: Any) -> tuple[Any, None]:
        # Each row's activations in order (a sorted-feature layer): the sort brings its comparator.
        return x + jnp.sort(jnp.tanh(x @ w), axis=-1), None

    def step(ws: Any, x: Any) -> Any:
        def loss(ws: Any) -> Any:
            y, _ = jax.lax.scan(layer, x, ws)
            return (y * y).mean()

        return jax.value_and_grad(loss)(ws)

    ws = jax.ShapeDtypeStruct((num_layers, hidden, hidden), jnp.float32,
                              sharding=NamedSharding(mesh, P(None, "fsdp", "tp")))  # fmt: skip
    x = jax.ShapeDtypeStruct((batch, hidden), jnp.float32, sharding=NamedSharding(mesh, P("fsdp", None)))
    return jax.jit(step), (ws, x)


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    jax.config.update("jax_use_shardy_partitioner", False)
    fn, step_args = _step()
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{NAME}.lowered.hlo").write_text(fn.lower(*step_args).as_text(dialect="hlo"))
    print(f"jax {jax.__version__}: wrote {out / NAME}.lowered.hlo")
    return 0


if __name__ == "__main__":
    sys.exit(main())

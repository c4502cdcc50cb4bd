"""Outputs left free handed to XLA as JAX hands them: without a sharding.

JAX compiles a step whose `out_shardings` pin some outputs and leave others unspecified with one
propagation flag per output, and its StableHLO carries `mhlo.sharding` on the pinned results only.
HLO text cannot leave one tuple element without a sharding: the lowered text, and XLA's dump of it,
write `{replicated}` for each free output. Compiled as text says, XLA starts the free output from
`{replicated}` and keeps it where propagation finds nothing it ranks above it: on the mixed-output
AdamW reference, the tied embedding's gradient stays replicated (7 MiB per chip more on XLA:TPU)
where JAX's own compile shards it over all 8 devices.

So, before compiling, the results propagation may shard (their flag is true) lose their
`mhlo.sharding`, and the compile starts from what JAX gives it. Example: flags `(false, true)` and
results `{mhlo.sharding = "{devices=[4,2]<=[8]}"}, {mhlo.sharding = "{replicated}"}` -> the first
kept, the second with no sharding.
"""

from __future__ import annotations

import io

from planner.hlo.text.stablehlo_text import main_function
from planner.plan.compilers.stablehlo import _entries


def unpin_free_outputs(mlir: bytes, flags: tuple[bool, ...]) -> bytes:
    """`mlir` (StableHLO, text or bytecode) with the `main` results whose flag is true left unsharded."""
    from jax._src.interpreters import mlir as jax_mlir
    from jaxlib.mlir import ir

    with jax_mlir.make_ir_context(), ir.Location.unknown():
        module = ir.Module.parse(mlir)
        main = main_function(module)
        if main is None or "res_attrs" not in main.attributes:
            return mlir
        results = [_entries(ir.DictAttr(d)) for d in ir.ArrayAttr(main.attributes["res_attrs"])]
        if len(results) != len(flags):
            return mlir  # one flag per output is what XLA takes; anything else is compiled as given
        for attrs, free in zip(results, flags):
            if free:
                attrs.pop("mhlo.sharding", None)
        main.attributes["res_attrs"] = ir.ArrayAttr.get([ir.DictAttr.get(a) for a in results])
        out = io.BytesIO()
        module.operation.write_bytecode(out)
        return out.getvalue()

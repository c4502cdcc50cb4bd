"""A Shardy module's StableHLO as JAX hands it to its compile: Shardy's shardings in the `sdy` dialect.

JAX lowers a Shardy step with `sdy.mesh` declarations and `sdy.sharding` attributes. XLA's HLO text of
the same step (what the planner reads, and writes placements into) carries those shardings in XLA's
round-trip form: `xla.sdy.sharding` frontend attributes, the module's `xla.sdy.meshes`, and an
`xla.sdy.FuncResultSharding` custom call per pinned result. `hlo_to_stablehlo` keeps that form as it
is, and the compile path, which exports the `sdy` dialect for XLA, finds no mesh in it; XLA's Shardy
pass then meets custom calls it cannot import (jax 0.7.1: "a custom call named 'xla.sdy.*' which
shouldn't appear in the XLA partitioner"; jax 0.12: "unknown mesh: mesh").

XLA's own round-trip import (`xla-sdy-round-trip-import-shardy-attrs`, which jaxlib registers since JAX
uses it too) turns the form back into the dialect: meshes become `sdy.mesh`, attributes `sdy.sharding`,
constraints `sdy.sharding_constraint`, result custom calls the function's result shardings. jax 0.12's
text names `@mesh` without declaring it; the mesh its GSPMD shardings pin down
(`planner.hlo.text.shardy_import.module_meshes`) is declared first.

Measured: the module JAX compiled for `ci_jax_llama_full_bf16_shardy_fsdp2_tp4_L4_D1024_pinned` (jax 0.7.1),
printed as HLO and compiled this way by XLA:CPU with Shardy, allocates 212,075,780 bytes per device,
JAX's own compile's number to the byte.

shard_map's round trip is rebuilt as XLA's `xla-sdy-round-trip-shard-map-import` does
(`planner.plan.compilers.shard_map_import`); the rest (`xla.sdy.ShardingGroup`, ...) is imported by passes jaxlib
does not register: such a module is refused.
"""

from __future__ import annotations

import re

from planner.errors import UnfaithfulConversion
from planner.hlo.ir.frontend_attributes import MESHES
from planner.hlo.ir.module import HloModule
from planner.hlo.text.shardy_import import GLOBAL_TO_LOCAL, declares_meshes, module_meshes
from planner.plan.compilers.shard_map_import import import_shard_maps

ROUND_TRIP_IMPORT = "builtin.module(xla-sdy-round-trip-import-shardy-attrs)"
# The frontend attributes that carry Shardy's shardings in the round-trip form.
ROUND_TRIP_KEYS = (MESHES, "xla.sdy.sharding", "xla.sdy.in_shardings", "xla.sdy.out_shardings")
FRONTEND_ATTRIBUTES = "mhlo.frontend_attributes"
_ROUND_TRIP_CALL = re.compile(r'stablehlo\.custom_call @(xla\.sdy\.\w+)|call_target_name = "(xla\.sdy\.\w+)"')


def meshes_text(module: HloModule) -> str | None:
    """`{mesh = #sdy.mesh<[...]>}` for a module that names a mesh without declaring it, else None."""
    if declares_meshes(module):
        return None
    meshes = module_meshes(module)
    if not meshes:
        return None
    return "{" + ", ".join(f"{name} = {mesh.to_text()}" for name, mesh in meshes.items()) + "}"


def import_shardy(mlir: bytes, module: HloModule) -> bytes:
    """`mlir` (`hlo_to_stablehlo` of `module`, a Shardy module) with its shardings in the `sdy` dialect.

    Raises `UnfaithfulConversion` where a round-trip custom call has no import in jaxlib."""
    import io

    from jax._src.interpreters import mlir as jax_mlir
    from jaxlib.mlir import ir
    from jaxlib.mlir.passmanager import PassManager

    undeclared = meshes_text(module)
    with jax_mlir.make_ir_context():
        parsed = ir.Module.parse(mlir)
        text = str(parsed)
        if not any(key in text for key in ROUND_TRIP_KEYS):
            # XLA's own dump on jax 0.12 writes Shardy shardings natively (`sharding={mesh[...], ...}`), which
            # the importer and XLA read as they are: nothing to import.
            return mlir
        if undeclared is not None:
            _declare_meshes(parsed, undeclared)
        PassManager.parse(ROUND_TRIP_IMPORT).run(parsed.operation)
        text = str(parsed)
        if GLOBAL_TO_LOCAL in text:
            text = import_shard_maps(text)
            parsed = ir.Module.parse(text)
        left = sorted({a or b for a, b in _ROUND_TRIP_CALL.findall(text)})
        if left:
            raise UnfaithfulConversion(
                f"the module's Shardy form has {', '.join(left)}, which jaxlib's compile path has no import for "
                "(XLA imports them in its own round trip; only the sharding attributes' import ships with jaxlib)"
            )
        out = io.BytesIO()
        parsed.operation.write_bytecode(out)
    return out.getvalue()


def _declare_meshes(parsed: object, meshes: str) -> None:
    """Add `xla.sdy.meshes` to the module's frontend attributes, keeping any it has."""
    from jaxlib.mlir import ir

    operation = parsed.operation  # type: ignore[attr-defined]
    entries: dict[str, ir.Attribute] = {}
    if FRONTEND_ATTRIBUTES in operation.attributes:
        existing = ir.DictAttr(operation.attributes[FRONTEND_ATTRIBUTES])
        entries = {existing[i].name: existing[i].attr for i in range(len(existing))}
    entries[MESHES] = ir.StringAttr.get(meshes)
    operation.attributes[FRONTEND_ATTRIBUTES] = ir.DictAttr.get(entries)

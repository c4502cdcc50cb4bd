"""Which front end wrote a module, from what the front ends name them.

torch_xla names the modules it compiles `SyncTensorsGraph.N`, and `IrToHlo.N` the
ones a client captures before compiling; JAX names them after the jitted function.
The answer decides which XLA compiled (and should verify) the module: torch_xla
bundles an XLA of its own and hands it the module as a proto, JAX goes through
StableHLO.

MaxText is a JAX trainer whose steps are built by its own layers and sharding rules,
so the model's error on them is measured, and its verdict banded, as a kind of its
own. Its modules say so in two ways: their source locations name files of the
`maxtext` package, and their Shardy mesh is MaxText's `mesh_axes`, whose names
(`fsdp_transpose`, `tensor_sequence`, `context_autoregressive`) no other front end
writes. StableHLO text printed without locations under GSPMD carries neither, and
reads as plain JAX.
"""

from __future__ import annotations

import re

from planner.hlo.ir.module import HloModule

TORCH_XLA_MODULE_PREFIXES = ("SyncTensorsGraph", "IrToHlo")

TORCH_XLA, MAXTEXT, JAX = "torch_xla", "maxtext", "jax"

# Axis names of MaxText's mesh (its configs' `mesh_axes`), all present in every mesh it builds.
MAXTEXT_MESH_AXES = frozenset({"fsdp_transpose", "tensor_sequence", "context_autoregressive"})

# A source file inside the `maxtext` package (site-packages/maxtext/..., or a checkout's src/maxtext/...).
_MAXTEXT_FILE = re.compile(r"(?:^|/)maxtext/")


def is_torch_xla_module(module: HloModule) -> bool:
    return module.name.startswith(TORCH_XLA_MODULE_PREFIXES)


def front_end_of(module: HloModule) -> str:
    """`torch_xla`, `maxtext` or `jax`: the front end that wrote `module`."""
    if is_torch_xla_module(module):
        return TORCH_XLA
    if _names_maxtext_files(module) or _has_maxtext_mesh(module):
        return MAXTEXT
    return JAX


def _names_maxtext_files(module: HloModule) -> bool:
    for section, rows in module.debug_tables:
        if section == "FileNames" and any(_MAXTEXT_FILE.search(text) for _, text in rows):
            return True
    for comp in module.computations:
        for inst in comp.instructions:
            metadata = inst.attr("metadata")
            source = getattr(metadata, "source_file", None)
            if isinstance(source, str) and _MAXTEXT_FILE.search(source):
                return True
    return False


def _has_maxtext_mesh(module: HloModule) -> bool:
    # Imported here: the Shardy importer reads sharding text and is heavier than this module's other users need.
    from planner.hlo.text.shardy_import import module_meshes

    return any(MAXTEXT_MESH_AXES.issubset(name for name, _ in mesh.axes) for mesh in module_meshes(module).values())

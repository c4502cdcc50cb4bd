"""Which front end wrote a module, from what the front ends name them.

torch_xla names the modules it compiles `SyncTensorsGraph.N`, and `IrToHlo.N` the
ones a client captures before compiling; JAX names them after the jitted function.
The answer decides which XLA compiled (and should verify) the module: torch_xla
bundles an XLA of its own and hands it the module as a proto, JAX goes through
StableHLO.
"""

from __future__ import annotations

from planner.hlo.ir import HloModule

TORCH_XLA_MODULE_PREFIXES = ("SyncTensorsGraph", "IrToHlo")


def is_torch_xla_module(module: HloModule) -> bool:
    return module.name.startswith(TORCH_XLA_MODULE_PREFIXES)

"""What the planner cannot help with, said with the next step: warnings a plan carries beside the request's.

A plan that finds nothing reads as "nothing to fix" unless it says why it could not look. Each check
here is a small value with one method: given the prepared step, the warning it calls for, or None.
- `NoShardingAnnotations`: no instruction carries a sharding that splits anything. XLA then keeps
  every tensor whole on every device: there is no sharding to simulate, fix or pin.
- `NoScannedLayers`: no While loop in a module that has layers (a dot or convolution). The planner's
  findings are about layers scanned in a loop (the stacked `[L, ...]` weights, gradients and saved
  activations a scan carries); unrolled layers have none of those. A module with no dot has no layers
  to scan, and the advice would not apply.
A `--mesh` that does not fit the module's shardings is warned of when the step is prepared
(`planner.mesh_check`), and reaches the plan with the request's other warnings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from planner.hlo.ir.module import HloModule
from planner.prepare import PreparedModule
from planner.sharding.hlo_sharding import HloSharding, Kind


class PlanCheck(Protocol):
    def apply(self, prepared: PreparedModule) -> str | None: ...


@dataclass(frozen=True)
class NoShardingAnnotations:
    """The step carries no sharding that splits a tensor (none at all, or only replicated ones)."""

    def apply(self, prepared: PreparedModule) -> str | None:
        found = _shardings(prepared.front)
        if any(s.kind in (Kind.TILED, Kind.MANUAL, Kind.MAXIMAL) for s in found):
            return None
        num_devices = _num_devices(prepared)
        on = f"each of the {num_devices} devices" if num_devices > 1 else "its one device"
        what = "carries no sharding annotations" if not found else "has only replicated sharding annotations"
        return (
            f"the module {what}: XLA keeps every tensor whole on {on} ({{replicated}}), so there is no sharding "
            "to fix and nothing to recommend. Shard the step first, then plan the new dump: torch_xla "
            "`xs.mark_sharding(tensor, mesh, partition_spec)` on the weights and inputs; JAX "
            "`jax.jit(step, in_shardings=..., out_shardings=...)` or "
            "`jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(...)))`"
        )


@dataclass(frozen=True)
class NoScannedLayers:
    """The step has layers but no While loop: no scan over them for the planner to look into."""

    def apply(self, prepared: PreparedModule) -> str | None:
        if prepared.loops or not _has_layers(prepared.front):
            return None
        return (
            "no While loop in the module: the planner looks for layers scanned in a loop (the stacked [L, ...] "
            "weights, gradients and saved activations a scan carries) and found none, so it has no per-layer "
            "findings; it still predicts HBM per chip and checks the gradients the step returns. To have the "
            "layers planned, run them as a scan over stacked weights: `jax.lax.scan` (or `flax.linen.scan`) in "
            "JAX, `torch_xla.experimental.scan_layers.scan_layers` in PyTorch/XLA"
        )


CHECKS: tuple[PlanCheck, ...] = (NoShardingAnnotations(), NoScannedLayers())


def plan_warnings(prepared: PreparedModule) -> list[str]:
    """Every check's warning for this step, in `CHECKS` order."""
    return [w for check in CHECKS if (w := check.apply(prepared)) is not None]


def _shardings(module: HloModule) -> list[HloSharding]:
    """Every array sharding written on the module's instructions (a tuple's elements one by one)."""
    found = []
    for comp in module.computations:
        for inst in comp.instructions:
            s = inst.sharding
            if s is not None:
                found += [e for e in s.elements if e is not None] if s.is_tuple else [s]
    return found


def _has_layers(module: HloModule) -> bool:
    """Whether the module multiplies by weights anywhere (a dot or a convolution)."""
    return any(inst.opcode in ("dot", "convolution") for comp in module.computations for inst in comp.instructions)


def _num_devices(prepared: PreparedModule) -> int:
    if prepared.mesh is not None:
        return prepared.mesh.num_devices
    partitions = prepared.source.attr("num_partitions")
    return partitions if isinstance(partitions, int) else 1

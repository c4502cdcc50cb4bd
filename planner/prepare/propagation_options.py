"""Options of the propagation pass, as XLA's ShardingPropagation takes them."""

from __future__ import annotations

from dataclasses import dataclass

from planner.hlo.ir.module import HloModule
from planner.hlo.structure.frontend import is_torch_xla_module


@dataclass(frozen=True, slots=True)
class PropagationOptions:
    """`is_spmd` selects GSPMD semantics; the allow flags are per output / per parameter.

    A single flag applies to every output (or parameter), as in XLA.
    """

    is_spmd: bool = True
    allow_to_output: tuple[bool, ...] = (False,)
    allow_to_parameters: tuple[bool, ...] = (False,)
    # False runs as if no shard_as/shard_like tags were written: what each member
    # of a group would get on its own (used to spot conflicting groups).
    shard_groups: bool = True

    @staticmethod
    def from_module(module: HloModule, is_spmd: bool = True) -> PropagationOptions:
        """Takes the allow flags from the module header, as XLA's compile does.

        A module torch_xla captured before compiling (`_get_xla_tensors_hlo`) has no header flags, but
        torch_xla compiles SPMD steps with outputs open to propagation (the compiled module's header says
        `allow_spmd_sharding_propagation_to_output={true}`): such a module is simulated as it will compile.
        """
        output_default = (True,) if is_torch_xla_module(module) else (False,)
        return PropagationOptions(
            is_spmd=is_spmd,
            allow_to_output=tuple(module.attr("allow_spmd_sharding_propagation_to_output", output_default)),
            allow_to_parameters=tuple(module.attr("allow_spmd_sharding_propagation_to_parameters", (False,))),
        )

    def output_allowed(self, index: int) -> bool:
        flags = self.allow_to_output
        return flags[0] if len(flags) == 1 else (index < len(flags) and flags[index])

    def parameter_allowed(self, number: int) -> bool:
        flags = self.allow_to_parameters
        return flags[0] if len(flags) == 1 else (number < len(flags) and flags[number])

"""Gradients the step returns directly: each output paired with the entry parameter it is the gradient of.

A layer's stacked gradient is a loop's accumulator (`scan_pairs`); the gradients of what is not
scanned (a token embedding, an LM head, a final norm) are computed once and returned. Propagation
decides their sharding like any other value, and can leave one split over fewer devices than its
parameter: on XLA:TPU, a free LM step's embedding and head gradients come out split over tp only.

Pairing: JAX returns `(loss, grads)` with the gradients in the order of the parameters, and
torch_xla returns each parameter's gradient; so outputs are paired with entry parameters of the
same shape, in order, each parameter once (a manifest names them instead). Only outputs
propagation may shard are paired (a fixed output sharding is the user's word), and an output that
is a loop's result is left to the loop's own findings.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.hlo.ir.debug_info import short_op_name
from planner.hlo.ir.module import HloModule
from planner.hlo.ir.shapes import ArrayShape
from planner.plan.diagnosis.output_parameters import outputs_and_parameters
from planner.plan.manifest import Manifest
from planner.prepare import PreparedModule
from planner.propagation import PropagationResult
from planner.sharding.hlo_sharding import HloSharding


@dataclass(frozen=True)
class OutputGradient:
    position: int  # in the entry root's tuple
    value: str  # the root operand: what to pin
    parameter: str  # the entry parameter it is the gradient of
    parameter_number: int
    shape: ArrayShape
    sharding: HloSharding | None  # as propagated
    ideal: HloSharding  # the parameter's
    label: str  # the parameter as the user named it, when its metadata says (`p['embed']`)


# Ops that move a value without computing on it: a layer's gradient torch_xla slices out of the
# stacked accumulator is still the loop's buffer, and the loop's findings cover it.
_MOVES = frozenset({"get-tuple-element", "copy", "bitcast", "reshape", "slice", "dynamic-slice", "transpose",
                    "convert", "custom-call"})  # fmt: skip


def _from_a_loop(module: HloModule, name: str) -> bool:
    entry = module.entry
    inst = entry[name]
    while inst.opcode in _MOVES and inst.operands:
        inst = entry[inst.operands[0]]
        if inst.opcode == "while":
            return True
    return False


def output_gradients(
    prepared: PreparedModule, result: PropagationResult, manifest: Manifest | None = None
) -> list[OutputGradient]:
    """The returned gradients; with a manifest, only the outputs it names as gradients.

    A whole training step also returns the updated parameters and optimizer state, of the parameters'
    shapes: paired by shape they would pass for gradients, and the manifest says which are not."""
    module = prepared.module
    found: list[OutputGradient] = []
    for position, value, match in outputs_and_parameters(module, manifest, prepared.mesh):
        if manifest is not None and (position >= len(manifest.outputs) or manifest.outputs[position] is None):
            continue
        ideal = match.sharding
        if not prepared.options.output_allowed(position) or value == match.name or ideal is None:
            continue
        if not ideal.is_tiled or _from_a_loop(module, value):
            continue
        sharding = result.sharding(value) if value in result else None
        label = (short_op_name(match.metadata.op_name) if match.metadata is not None else None) or match.name
        shape = module.entry[value].shape
        assert isinstance(shape, ArrayShape)
        found.append(OutputGradient(position, value, match.name, match.parameter_number or 0, shape, sharding, ideal,
                                    label))  # fmt: skip
    return found

"""Which entry parameter each output of a step is the gradient of, read from the step's signature alone.

JAX returns `(loss, grads)` with the gradients in the order of the parameters (one pytree), and torch_xla
returns each parameter's gradient in the order of its parameters: so outputs are paired with entry
parameters of the same dims, in order, each parameter once. Both the plan's findings (`output_pairs`,
`scan_pairs`) and the check of what XLA returns read this one pairing.
"""

from __future__ import annotations

from collections.abc import Iterator

from planner.hlo.ir import HloModule, Instruction
from planner.hlo.shapes import ArrayShape


def outputs_and_parameters(module: HloModule) -> Iterator[tuple[int, str, Instruction]]:
    """Each array output of the entry root's tuple paired with the entry parameter of the same dims it is taken
    to be the gradient of: (position in the tuple, the root operand, the parameter), in order, each parameter
    once."""
    entry = module.entry
    root = entry.root
    if root.opcode != "tuple":
        return
    parameters = [p for p in entry.parameters if isinstance(p.shape, ArrayShape)]
    taken: set[str] = set()
    for position, value in enumerate(root.operands):
        shape = entry[value].shape
        if not isinstance(shape, ArrayShape) or shape.rank == 0:
            continue
        match = next((p for p in parameters if p.name not in taken and p.shape.dims == shape.dims), None)  # type: ignore[union-attr]
        if match is None:
            continue
        taken.add(match.name)
        yield position, value, match

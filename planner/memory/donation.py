"""Which outputs a compile writes into a donated parameter's buffer.

A module ties outputs to parameters in two ways. `input_output_alias={ {0}: (1, {}, may-alias) }` ties
them outright. `buffer_donor={ (1, {}), (2, {}) }` only says the caller gives up those parameters'
buffers: torch_xla writes it for the parameters and optimizer state it donates, JAX's
`jax.buffer_donor` arguments become it. XLA then pairs donors with outputs itself
(`OptimizeInputOutputBufferAlias`, run by every backend's compiler on the partitioned module):

- a donor is an array parameter leaf listed in `buffer_donor` and not already aliased; a donee is an
  output leaf not already aliased;
- both lists are sorted by bytes (per device, as partitioned), largest first, ties in their order;
- walking both from the top, a donor larger than the current donee is skipped, a donee larger than
  the current donor is skipped, and equal sizes pair: the output is written into the donor's buffer.

Only bytes are compared, not element types or shapes: a donated f32[1024] can hold an s32[1024] output.
Worked example: donors p1 (4 MiB) and p2 (4 MiB), outputs o0 (4 MiB), o1 (8 MiB), o2 (4 MiB): sorted,
donees are o1, o0, o2; o1 is larger than p1 and is skipped; o0 pairs with p1, o2 with p2.
"""

from __future__ import annotations

import re

from planner.hlo.ir.module import HloModule
from planner.hlo.ir.shapes import Shape, TupleShape
from planner.memory.buffers import array_leaves, leaf_shardings, per_device_bytes, sharding_of
from planner.propagation import PropagationResult

# One (parameter number, shape index) of the header's `buffer_donor` set.
_DONOR = re.compile(r"\((\d+),\s*\{([\d,\s]*)\}\)")
# One `{output index}: (parameter number, {parameter index}` of `input_output_alias`.
_ALIAS = re.compile(r"\{([\d,\s]*)\}\s*:\s*\(\s*(\d+)\s*,\s*\{([\d,\s]*)\}")

ShapeIndex = tuple[int, ...]


def _index(text: str) -> ShapeIndex:
    return tuple(int(i) for i in text.replace(" ", "").split(",") if i)


def _header_text(module: HloModule, key: str) -> str:
    value = module.attr(key)
    return "" if value is None else getattr(value, "text", str(value))


def buffer_donors(module: HloModule) -> frozenset[tuple[int, ShapeIndex]]:
    """The header's `buffer_donor` set: (parameter number, shape index) pairs.

    Example: `buffer_donor={ (1, {}), (2, {}) }` (torch_xla donates AdamW's moments) is {(1, ()), (2, ())}.
    Donation lets XLA reuse a parameter's buffer for an output: on the LM AdamW steps XLA:TPU's total drops by
    a quarter with it.
    """
    text = _header_text(module, "buffer_donor")
    return frozenset((int(m.group(1)), _index(m.group(2))) for m in _DONOR.finditer(text))


def declared_aliases(module: HloModule) -> dict[ShapeIndex, tuple[int, ShapeIndex]]:
    """`input_output_alias` as {output shape index: (parameter number, parameter shape index)}."""
    return {
        _index(m.group(1)): (int(m.group(2)), _index(m.group(3)))
        for m in _ALIAS.finditer(_header_text(module, "input_output_alias"))
    }


def leaf_indices(shape: Shape) -> list[ShapeIndex]:
    """The shape index of each array leaf, in `array_leaves` order (depth first)."""
    if not isinstance(shape, TupleShape):
        return [()]
    return [(i, *rest) for i, element in enumerate(shape.elements) for rest in leaf_indices(element)]


def donated_outputs(
    module: HloModule,
    parameter_bytes: dict[tuple[int, ShapeIndex], int],
    output_bytes: list[tuple[ShapeIndex, int]],
) -> dict[ShapeIndex, tuple[int, ShapeIndex]]:
    """The outputs XLA pairs with a registered buffer donor: {output index: (parameter, parameter index)}.

    `parameter_bytes` gives each entry parameter leaf's bytes per device, `output_bytes` each output leaf's
    (shape index, bytes per device) in order; outputs `input_output_alias` already ties are left out, as are
    donors it already uses."""
    declared = declared_aliases(module)
    taken = set(declared.values())
    donors = [(key, parameter_bytes[key]) for key in sorted(buffer_donors(module))
              if key in parameter_bytes and key not in taken]  # fmt: skip
    donees = [(index, size) for index, size in output_bytes if index not in declared]
    # Stable sorts, largest first: equal sizes keep parameter (and output) order.
    donors.sort(key=lambda d: -d[1])
    donees.sort(key=lambda d: -d[1])
    paired: dict[ShapeIndex, tuple[int, ShapeIndex]] = {}
    i = j = 0
    while i < len(donors) and j < len(donees):
        (donor, donor_size), (donee, donee_size) = donors[i], donees[j]
        if donor_size > donee_size:
            i += 1
        elif donor_size < donee_size:
            j += 1
        else:
            paired[donee] = donor
            i, j = i + 1, j + 1
    return paired


def outputs_in_parameter_buffers(module: HloModule, result: PropagationResult) -> set[int]:
    """The output leaves (positions in `array_leaves` of the entry root) written into a parameter's buffer:
    those `input_output_alias` ties and those XLA pairs with a registered buffer donor, sized per device with
    the shardings `result` gives."""
    return set(output_parameter_pairs(module, result))


def output_parameter_pairs(module: HloModule, result: PropagationResult) -> dict[int, tuple[int, ShapeIndex]]:
    """`outputs_in_parameter_buffers` with the parameter leaf each output is written into:
    {output leaf position: (parameter number, parameter shape index)}."""
    entry = module.entry
    root_indices = leaf_indices(entry.root.shape)
    declared = declared_aliases(module)
    if not buffer_donors(module):
        return {k: declared[index] for k, index in enumerate(root_indices) if index in declared}
    parameter_bytes = {}
    for param in entry.parameters:
        shardings = leaf_shardings(param.shape, sharding_of(result, param.name))
        for index, leaf, s in zip(leaf_indices(param.shape), array_leaves(param.shape), shardings):
            parameter_bytes[(param.parameter_number or 0, index)] = per_device_bytes(leaf, s)
    root_shardings = leaf_shardings(entry.root.shape, sharding_of(result, entry.root_name))
    leaves = array_leaves(entry.root.shape)
    output_bytes = [(index, per_device_bytes(leaf, s)) for index, leaf, s in zip(root_indices, leaves, root_shardings)]
    donated = donated_outputs(module, parameter_bytes, output_bytes)
    tied = declared | donated
    return {k: tied[index] for k, index in enumerate(root_indices) if index in tied}

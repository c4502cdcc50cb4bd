"""Which entry parameter each output of a step is the gradient of, read from the step's signature alone.

JAX returns `(loss, grads)` with the gradients in the order of the parameters (one pytree), and torch_xla
returns each parameter's gradient in the order of its parameters: so outputs are paired with entry
parameters of the same dims, in order, each parameter once. Both the plan's findings (`output_pairs`,
`scan_pairs`) and the check of what XLA returns read this one pairing.

Same dims are not enough where two parameters share them: an LM's token embedding and its head are both
[vocab, hidden], and torch_xla numbers its entry parameters in the order the graph first reads them, not
the model's. Where a manifest names the output's parameter, its partition spec says which one: the
parameter of those dims that is sharded as the spec says (the embedding over fsdp, the head over tensor
and fsdp) is preferred to the first of those dims. A torch_xla step without a manifest leaves such an
output unpaired when the candidates are sharded differently: the first of them would be a guess.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from planner.hlo.ir.module import HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.hlo.structure.frontend import TORCH_XLA, front_end_of
from planner.mesh import Mesh
from planner.plan.manifest import Manifest
from planner.sharding.hlo_sharding import HloSharding
from planner.sharding.partition_spec import spec_sharding


def outputs_and_parameters(
    module: HloModule, manifest: Manifest | None = None, mesh: Mesh | None = None
) -> Iterator[tuple[int, str, Instruction]]:
    """Each array output of the entry root's tuple paired with the entry parameter of the same dims it is taken
    to be the gradient of: (position in the tuple, the root operand, the parameter), in order, each parameter
    once; with a manifest and the mesh, of those dims the one sharded as the manifest's parameter is."""
    entry = module.entry
    root = entry.root
    if root.opcode != "tuple":
        return
    parameters = [p for p in entry.parameters if isinstance(p.shape, ArrayShape)]
    named = _named_shardings(manifest, mesh)
    torch_xla = front_end_of(module) == TORCH_XLA
    taken: set[str] = set()
    for position, value in enumerate(root.operands):
        shape = entry[value].shape
        if not isinstance(shape, ArrayShape) or shape.rank == 0:
            continue
        free = [p for p in parameters if p.name not in taken and p.shape.dims == shape.dims]  # type: ignore[union-attr]
        wanted = named.get(position)
        match = next((p for p in free if wanted is not None and _same(p.sharding, wanted)), None)
        if match is None and wanted is None and torch_xla and len({_text(p.sharding) for p in free}) > 1:
            continue  # torch_xla's order says nothing, and the candidates' shardings differ: no pair, not a guess
        match = match or next(iter(free), None)
        if match is None:
            continue
        taken.add(match.name)
        yield position, value, match


def _named_shardings(manifest: Manifest | None, mesh: Mesh | None) -> Mapping[int, HloSharding]:
    """Output position -> the sharding of the parameter the manifest says it is the gradient of."""
    if manifest is None or mesh is None:
        return {}
    by_name = {p.name: p for p in manifest.parameters}
    return {position: spec_sharding(list(by_name[name].partition_spec), mesh)
            for position, name in enumerate(manifest.outputs) if name is not None and name in by_name}  # fmt: skip


def _text(sharding: HloSharding | None) -> str | None:
    return sharding.to_short_text() if sharding is not None else None


def _same(sharding: HloSharding | None, wanted: HloSharding) -> bool:
    return sharding is not None and _text(sharding) == _text(wanted)

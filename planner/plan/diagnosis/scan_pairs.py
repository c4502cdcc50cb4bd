"""Scanned parameters and their stacked gradients, paired through the step's dataflow.

A scan over layers is a While whose carried tuple holds the stacked weights
`[L, ...]` read-only (the forward loop's `xs`): each iteration slices out one
layer. Its backward is another While that carries one `[L, ...]` accumulator
per weight and writes one layer's gradient into it per iteration; the
accumulator flows to the step's outputs.

Pairing an accumulator with its parameter:
- with a manifest, by name: the outputs the accumulator reaches are named
  gradients, and the manifest's partition spec of that parameter is the ideal;
- otherwise through the step's outputs: the accumulator reaches an output,
  the step returns each parameter's gradient in the parameters' order (JAX's
  gradient pytree, torch_xla's parameter list: `output_pairs`), and the
  forward loop is given that parameter. Two weights of one shape (Llama's wq
  and wo) are told apart this way; XLA's backward loop need not carry them in
  the forward loop's order (a JAX remat step carries wo's accumulator before
  wq's, and a pin written by carried order lands on the other weight);
- where the outputs do not say (a loop inside another loop's body), by
  position: the k-th accumulator of a shape is the gradient of the k-th
  scanned parameter of that shape. When the counts differ the pairing falls
  back to the best-sharded parameter of the shape and says so.

Gradient accumulation nests the layer scan in a scan over microbatches: the
backward loop runs inside the outer loop's body, and the outer loop carries
one f32 accumulator per parameter, `acc + this microbatch's gradient` each
iteration. An outer accumulator that sums a backward loop's stacked gradient
is paired with that gradient's parameter (`accumulated_gradients`); it is not
itself a stacked gradient even when the microbatch count equals the layer
count.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape, TupleShape
from planner.hlo.structure.loops import WhileLoop, invariant_elements, while_loops
from planner.memory.buffers import leaf_shardings, per_device_bytes
from planner.mesh import Mesh
from planner.plan.diagnosis.output_parameters import outputs_and_parameters
from planner.plan.manifest import Manifest, layer_relative
from planner.propagation import PropagationResult
from planner.sharding import algebra
from planner.sharding.hlo_sharding import HloSharding
from planner.sharding.partition_spec import AxisSpec, spec_sharding

# Ops through which a value is still the same tensor, up to size-1 dims and dtype.
_CARRIERS = frozenset("reshape bitcast broadcast copy convert".split())
# Ops through which a carried element still reaches the step's outputs as that value.
_TO_OUTPUT = _CARRIERS | {"slice", "transpose", "dynamic-slice", "multiply", "divide", "add", "subtract"}


@dataclass(frozen=True)
class ScanParameter:
    """A stacked weight the forward loop reads one layer of per iteration."""

    loop: str
    index: int
    shape: ArrayShape
    sharding: HloSharding  # as propagated: the parameter's shard
    body: str
    layer_slice: str | None  # the body's one-layer value (the weight inside the scanned function)
    entry_parameter: str | None  # the step's parameter the loop is given, when it is given one

    @property
    def per_device_bytes(self) -> int:
        return per_device_bytes(self.shape, self.sharding)

    @property
    def key(self) -> str:
        return f"{self.loop}[{self.index}]"


@dataclass(frozen=True)
class StackedGradient:
    """A backward loop's `[L, ...]` accumulator, paired with the parameter it is the gradient of."""

    loop: str
    index: int
    shape: ArrayShape
    sharding: HloSharding | None
    body: str
    producer: str  # the body root operand that writes the element each iteration
    layer_gradient: str | None  # the one-layer gradient before it is written (what to pin)
    parameter: ScanParameter | None
    ideal: HloSharding | None  # the stacked parameter's sharding
    name: str | None  # the parameter's name inside the scanned layer, from the manifest
    partition_spec: list[AxisSpec] | None  # per layer
    matched_by: str  # "manifest", "output", "position" or "shape"

    @property
    def key(self) -> str:
        return f"{self.loop}[{self.index}]"


@dataclass(frozen=True)
class AccumulatedGradient:
    """An outer loop's accumulator summing, each iteration, a nested backward loop's stacked gradient."""

    loop: str
    index: int
    shape: ArrayShape
    sharding: HloSharding | None
    body: str
    update: str  # the body root operand, accumulator + this iteration's gradient: what to pin
    gradient: StackedGradient  # the nested loop's accumulator it sums, paired with the parameter

    @property
    def key(self) -> str:
        return f"{self.loop}[{self.index}]"

    @property
    def ideal(self) -> HloSharding | None:
        return self.gradient.ideal


def is_stacked(shape: object, trip_count: int | None) -> bool:
    return isinstance(shape, ArrayShape) and shape.rank >= 2 and shape.dims[0] == trip_count


def carried_loops(module: HloModule, result: PropagationResult) -> list[tuple[WhileLoop, list[HloSharding | None]]]:
    loops = []
    for loop in while_loops(module):
        shape = loop.instruction.shape
        if loop.trip_count is None or not isinstance(shape, TupleShape):
            continue
        loops.append((loop, leaf_shardings(shape, result.sharding(loop.name))))
    return loops


def _init_origin(module: HloModule, loop: WhileLoop, index: int) -> Instruction | None:
    """Where the element's initial value comes from, through tuples and carriers: the While whose result it
    is (a saved residual), the parameter it is, or None."""
    comp = module.computation(loop.computation)
    init = comp[loop.instruction.operands[0]]
    if init.opcode != "tuple":
        return None
    name, element = init.operands[index], None
    for _ in range(16):
        inst = comp[name]
        if inst.opcode == "while" or (inst.opcode == "parameter" and element is None):
            return inst
        if inst.opcode == "get-tuple-element":
            name, element = inst.operands[0], inst.attr("index")
        elif inst.opcode == "tuple" and element is not None:
            name, element = inst.operands[element], None
        elif inst.opcode in _CARRIERS and inst.operands:
            name = inst.operands[0]
        else:
            return None
    return None


def _init_from_loop(module: HloModule, loop: WhileLoop, index: int) -> bool:
    """Whether the element's initial value is another While's result (a saved residual)."""
    origin = _init_origin(module, loop, index)
    return origin is not None and origin.opcode == "while"


def _entry_parameter(module: HloModule, loop: WhileLoop, index: int) -> str | None:
    """The entry parameter a loop in the entry computation is given as element `index`, if it is one."""
    if loop.computation != module.entry_name:
        return None
    origin = _init_origin(module, loop, index)
    return origin.name if origin is not None and origin.opcode == "parameter" else None


def scan_parameters(module: HloModule, result: PropagationResult) -> list[ScanParameter]:
    found = []
    for loop, shardings in carried_loops(module, result):
        body = module.computation(loop.body)
        invariant = invariant_elements(body)
        for i, (leaf, s) in enumerate(zip(loop.instruction.shape.elements, shardings)):  # type: ignore[union-attr]
            if i not in invariant or not is_stacked(leaf, loop.trip_count) or s is None:
                continue
            if _init_from_loop(module, loop, i):
                continue
            assert isinstance(leaf, ArrayShape)
            found.append(ScanParameter(loop.name, i, leaf, s, body.name, _layer_slice(body, i, leaf.rank),
                                       _entry_parameter(module, loop, i)))  # fmt: skip
    return found


def _layer_slice(body: Computation, index: int, rank: int) -> str | None:
    """gte(param, index) -> dynamic-slice of one layer -> reshape dropping the layer dim."""
    param = body.parameters[0].name
    for gte in body.users(param):
        if body[gte].opcode != "get-tuple-element" or body[gte].attr("index") != index:
            continue
        for ds in body.users(gte):
            sliced = body[ds]
            if sliced.opcode != "dynamic-slice" or not isinstance(sliced.shape, ArrayShape):
                continue
            if sliced.shape.dims[0] != 1:
                continue
            for user in body.users(ds):
                squeezed = body[user]
                drops_layer_dim = (
                    isinstance(squeezed.shape, ArrayShape) and squeezed.shape.dims == sliced.shape.dims[1:]
                )
                if squeezed.opcode in ("reshape", "bitcast") and drops_layer_dim:
                    return squeezed.name
            return sliced.name
    return None


def layer_gradient(body: Computation, producer: str) -> str | None:
    """The one-layer gradient the accumulator's update carries, before carriers and shard_as.

    From the dynamic-update-slice that writes the layer, back through tuples,
    reshapes that add the layer dim (or any size-1 dim), copies and `shard_as` annotations, to the
    op that computes it (for a weight gradient: the dot, or its transpose into
    the weight's layout). That value is what `mark_sharding_with_gradients`
    pins inside the scanned function.
    """
    inst = body[producer]
    if inst.opcode != "dynamic-update-slice":
        return None
    name, element = inst.operands[1], None
    for _ in range(64):
        inst = body[name]
        if inst.opcode == "get-tuple-element":
            name, element = inst.operands[0], inst.attr("index")
        elif inst.opcode == "tuple" and element is not None:
            name, element = inst.operands[element], None
        elif (inst.opcode in _CARRIERS and len(inst.operands) == 1 and _same_tensor(inst, body[inst.operands[0]])) or (
            inst.opcode == "custom-call" and is_shard_group_only(inst.sharding)
        ):
            name = inst.operands[0]
        else:
            return name if element is None else None
    return None


def _same_tensor(carrier: Instruction, operand: Instruction) -> bool:
    """Whether `carrier` holds `operand`'s tensor with only size-1 dims added or dropped. A reshape that
    regroups dims does not: XLA:TPU's `tpu-reduce-rewriter` leaves a bias gradient as `f32[8,32]` (heads,
    head dim) reshaped to the bias's `f32[256]`, and the one-layer gradient to pin is the `f32[256]`."""
    if not isinstance(carrier.shape, ArrayShape) or not isinstance(operand.shape, ArrayShape):
        return False
    return _without_ones(carrier.shape.dims) == _without_ones(operand.shape.dims)


def _without_ones(dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in dims if d != 1)


def is_shard_group_only(s: HloSharding | None) -> bool:
    """A `{unknown shard_as N}` annotation: it ties values together without fixing a sharding."""
    return s is not None and not s.is_tuple and s.shard_group is not None and s.is_unknown


def output_positions(module: HloModule, loop: WhileLoop, index: int) -> list[int]:
    """Entry root positions that element `index` of the loop's result flows to.

    A loop nested in another loop's body (the layer scan inside a scan over microbatches) reaches the
    outputs through the outer loop: the element flows to the body's root, which is the outer loop's
    next carry, and from the outer loop's result on to the entry's root.
    """
    return _positions_from(module, loop.computation, loop.name, index)


def _positions_from(module: HloModule, comp_name: str, start: str, index: int) -> list[int]:
    positions = _root_positions(module.computation(comp_name), start, index)
    if comp_name == module.entry_name:
        return positions
    reached: set[int] = set()
    for comp in module.computations:
        for inst in comp.instructions:
            if inst.opcode != "while" or inst.attr("body").names[0] != comp_name:
                continue
            # The whole root (-1) is the outer loop's whole carry: no single element to follow.
            for position in positions:
                if position >= 0:
                    reached.update(_positions_from(module, comp.name, inst.name, position))
    return sorted(reached)


def _root_positions(comp: Computation, start: str, index: int) -> list[int]:
    """Positions of `comp`'s root tuple that element `index` of `start`'s result flows to (-1: the root itself)."""
    root = comp.root
    positions: list[int] = []
    frontier: list[tuple[str, int]] = [(start, index)]
    seen: set[tuple[str, int]] = set()
    while frontier:
        name, element = frontier.pop()
        if (name, element) in seen:
            continue
        seen.add((name, element))
        for user_name in comp.users(name):
            user = comp[user_name]
            if user.opcode == "get-tuple-element":
                if element < 0 or user.attr("index") == element:
                    frontier.append((user_name, -1))
            elif user.opcode == "tuple":
                if user_name == root.name and element < 0:
                    positions.extend(i for i, o in enumerate(user.operands) if o == name)
                else:
                    frontier.extend((user_name, i) for i, o in enumerate(user.operands) if o == name)
            elif user.opcode in _TO_OUTPUT and element < 0:
                frontier.append((user_name, -1))
        if name == root.name and element < 0:
            positions.append(-1)
    return sorted(set(positions))


def reaches_output(module: HloModule, loop: WhileLoop, index: int) -> bool:
    return bool(output_positions(module, loop, index))


def stacked_gradients(
    module: HloModule, result: PropagationResult, manifest: Manifest | None = None, mesh: Mesh | None = None
) -> list[StackedGradient]:
    """Every backward accumulator that reaches the outputs and has a stacked parameter of its shape."""
    params = scan_parameters(module, result)
    returned_for = {
        position: parameter.name for position, _, parameter in outputs_and_parameters(module, manifest, mesh)
    }
    gradients: list[StackedGradient] = []
    for loop, shardings in carried_loops(module, result):
        body = module.computation(loop.body)
        invariant = invariant_elements(body)
        leaves = loop.instruction.shape.elements  # type: ignore[union-attr]
        taken: dict[tuple[int, ...], int] = {}
        for i, (leaf, s) in enumerate(zip(leaves, shardings)):
            if i in invariant or not is_stacked(leaf, loop.trip_count):
                continue
            assert isinstance(leaf, ArrayShape)
            same_shape = [p for p in params if p.shape.dims == leaf.dims and p.loop != loop.name]
            producer = body.root.operands[i] if body.root.opcode == "tuple" else body.root_name
            if not same_shape or summed_loop_element(body, i, producer) is not None:
                continue
            positions = output_positions(module, loop, i)
            if not positions:
                continue
            rank = taken.get(leaf.dims, 0)
            taken[leaf.dims] = rank + 1
            returned = {returned_for[p] for p in positions if p in returned_for}
            by_output = [p for p in same_shape if p.entry_parameter is not None and p.entry_parameter in returned]
            returned_as = by_output[0] if len(by_output) == 1 else None
            pair = _pair(module, loop, i, leaf, s, body, producer, same_shape, rank, positions, manifest, mesh,
                         returned_as)  # fmt: skip
            gradients.append(pair)
    return gradients


def accumulated_gradients(
    module: HloModule, result: PropagationResult, gradients: list[StackedGradient]
) -> list[AccumulatedGradient]:
    """Every loop element that sums, each iteration, a stacked gradient of a loop nested in its body."""
    by_key = {g.key: g for g in gradients}
    found = []
    for loop, shardings in carried_loops(module, result):
        body = module.computation(loop.body)
        if body.root.opcode != "tuple":
            continue
        for i, (leaf, s) in enumerate(zip(loop.instruction.shape.elements, shardings)):  # type: ignore[union-attr]
            if not isinstance(leaf, ArrayShape):
                continue
            summed = summed_loop_element(body, i, body.root.operands[i])
            gradient = by_key.get(f"{summed[0]}[{summed[1]}]") if summed is not None else None
            if gradient is not None and gradient.shape.dims == leaf.dims:
                found.append(AccumulatedGradient(loop.name, i, leaf, s, body.name, body.root.operands[i], gradient))
    return found


def summed_loop_element(body: Computation, index: int, update: str) -> tuple[str, int] | None:
    """(While, element) when the body's next carry `index` is `carry[index] + a nested While's element`."""
    inst = body[_computed(body, update)]
    if inst.opcode != "add" or len(inst.operands) != 2:
        return None
    sides = [_source(body, o) for o in inst.operands]
    param = body.parameters[0].name if body.parameters else None
    for mine, other in (sides, sides[::-1]):
        if mine == (param, index) and other is not None and body[other[0]].opcode == "while":
            return other
    return None


def _computed(body: Computation, name: str) -> str:
    """The instruction a value is, through elements of tuples built in the body (JAX's call results)."""
    for _ in range(32):
        inst = body[name]
        if inst.opcode != "get-tuple-element" or body[inst.operands[0]].opcode != "tuple":
            return name
        name = body[inst.operands[0]].operands[inst.attr("index")]
    return name


def _source(body: Computation, name: str) -> tuple[str, int] | None:
    """(tuple-shaped instruction, element) a value is read from, through carriers; None if computed."""
    for _ in range(32):
        inst = body[_computed(body, name)]
        if inst.opcode == "get-tuple-element":
            return inst.operands[0], inst.attr("index")
        if inst.opcode in _CARRIERS and len(inst.operands) == 1:
            name = inst.operands[0]
        else:
            return None
    return None


def _pair(
    module: HloModule,
    loop: WhileLoop,
    index: int,
    leaf: ArrayShape,
    sharding: HloSharding | None,
    body: Computation,
    producer: str,
    same_shape: list[ScanParameter],
    rank: int,
    positions: list[int],
    manifest: Manifest | None,
    mesh: Mesh | None,
    returned_as: ScanParameter | None,
) -> StackedGradient:
    if returned_as is not None:
        parameter, matched_by = returned_as, "output"
    elif rank < len(same_shape):
        parameter, matched_by = same_shape[rank], "position"
    else:
        parameter, matched_by = min(same_shape, key=lambda p: p.per_device_bytes), "shape"
    ideal = parameter.sharding
    name, spec = None, None
    if manifest is not None:
        named = _manifest_spec(manifest, positions, leaf, mesh)
        if named is not None:
            name, spec, ideal = named
            matched_by = "manifest"
    return StackedGradient(
        loop.name,
        index,
        leaf,
        sharding,
        body.name,
        producer,
        layer_gradient(body, producer),
        parameter,
        ideal,
        name,
        spec,
        matched_by,
    )


def _manifest_spec(
    manifest: Manifest, positions: list[int], leaf: ArrayShape, mesh: Mesh | None
) -> tuple[str, list[AxisSpec], HloSharding] | None:
    names = {manifest.outputs[p] for p in positions if 0 <= p < len(manifest.outputs) and manifest.outputs[p]}
    if not names:
        return None
    if mesh is None:
        raise ValueError("a manifest needs the mesh (its partition specs name mesh axes)")
    specs = {}
    for full in sorted(n for n in names if n is not None):
        p = manifest.parameter(full)
        spec = list(p.partition_spec)
        if len(p.shape) == leaf.rank - 1:
            spec = [None, *spec]  # a per-layer parameter: the layer dim is not split
        if tuple(p.shape) not in (leaf.dims, leaf.dims[1:]):
            raise ValueError(
                f"parameter {full!r} has shape={p.shape}, but its stacked gradient is {leaf.to_text(False)}"
            )
        if len(spec) != leaf.rank:
            raise ValueError(
                f"parameter {full!r} has shape={p.shape} and partition_spec={p.partition_spec}, "
                f"which do not fit its stacked gradient {leaf.to_text(False)}"
            )
        specs[layer_relative(full)] = spec
    if len({str(s) for s in specs.values()}) != 1:
        raise ValueError(
            f"one stacked gradient {leaf.to_text(False)} is the gradient of parameters with "
            f"different partition specs: {specs}"
        )
    name, spec = next(iter(specs.items()))
    if len(specs) > 1:
        name = "|".join(sorted(specs))
    return name, spec[1:] if leaf.rank > 1 else spec, spec_sharding(spec, mesh)


def layer_sharding(stacked: HloSharding, layer_rank: int) -> HloSharding:
    """The sharding of one layer of a stacked value: the layer dim dropped (replicated over it if split)."""
    if not stacked.is_tiled:
        return stacked
    one = algebra.partially_replicate_on_dims(stacked, [0]) if stacked.data_tile_dims[0] != 1 else stacked
    reduced = algebra.remove_dims(one, [0])
    assert reduced.tiled_data_rank == layer_rank
    return reduced

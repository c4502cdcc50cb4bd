"""The user's names for HLO values: `grad of params['wq']` where the dump says `while.74[9]`.

Where a name comes from:
- an entry parameter: the framework's name. JAX writes it in the metadata
  (`metadata={op_name="params['wq']"}`); torch_xla writes none, so the names
  come from the client, in the model's parameter order (`model.named_parameters()`,
  or a manifest's parameters), and are matched to the dump through the scan's
  stacking (below);
- a While's carried element: what feeds it. A read-only element is named
  after the entry parameter or stacked value it is initialised from; a
  stacked gradient after the parameter `scan_pairs` pairs it with
  (`grad of ...`); an element initialised from another loop's result (a
  residual the backward reads) after that result; any other element after
  the op_name of the value the body writes into it each iteration;
- an instruction: inside a loop body, the carried element it is one layer of
  (the weight's slice, or the gradient written into the accumulator);
  elsewhere its op_name, shortened to what the user wrote.

Worked example of the torch_xla matching (bundled dump, 8 layers of 9
weights): the entry stacks `concatenate(reshape(p74), ..., reshape(p67))` and
the forward While carries that stack at element 2, the next at 3, ..., the
ninth at 10. torch_xla's scan carries a layer's parameters in
`named_parameters()` order, so grouping the client's names
`0.q.weight, 0.k.weight, ..., 7.n2.weight` by the name without the layer
index gives `q.weight, k.weight, ..., n2.weight` in that order: element 2 is
`q.weight`, and its k-th operand is layer k's weight, so `p74` is
`0.q.weight` and `p67` is `7.q.weight`. The counts must agree (9 stacks, 9
groups of 8 names), else nothing is named from the list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from planner.hlo.ir.debug_info import short_op_name, source_location
from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.hlo.structure.loops import WhileLoop, invariant_elements, while_loops
from planner.plan.diagnosis.scan_pairs import StackedGradient, is_stacked
from planner.plan.manifest import Manifest

# Ops through which a value is still the same tensor (a layout or dtype away).
_CARRIERS = frozenset("reshape bitcast copy convert transpose".split())
_SLICES = frozenset({"slice", "dynamic-slice"})
# Elementwise ops that, by a scalar, leave a value what it was up to scale (a weight times 1.0 from autograd).
_SCALINGS = frozenset({"multiply", "divide", "add", "subtract"})
# How far to follow a value through carriers, tuples and loops.
_MAX_TRACE = 64
_LAYER = re.compile(r"^(?P<prefix>(?:.*?\.)?)(?P<layer>\d+)\.(?P<rest>.+)$")
_ELEMENT = re.compile(r"^(?P<loop>.+)\[(?P<index>\d+)\]$")


def without_layer(name: str) -> tuple[str, int] | None:
    """`layers.3.mlp.down.weight` -> (`layers.mlp.down.weight`, 3): the name across layers, and the layer."""
    m = _LAYER.match(name)
    if m is None:
        return None
    return m.group("prefix") + m.group("rest"), int(m.group("layer"))


def stacked_name(names: Sequence[str]) -> str | None:
    """The name of a stack of per-layer values: their common name without the layer index."""
    across = {split[0] if (split := without_layer(n)) is not None else n for n in names}
    return across.pop() if len(across) == 1 else None


@dataclass(frozen=True)
class NameTable:
    """The user's names for one module's entry parameters, carried elements and instructions."""

    parameters: Mapping[int, str]  # entry parameter number -> name
    elements: Mapping[tuple[str, int], str]  # (While, carried index) -> name
    body_values: Mapping[str, str]  # a body instruction -> the name of the element it reads or writes
    op_names: Mapping[str, str]  # instruction -> its shortened op_name
    # entry output position -> the parameter a manifest says it is the gradient of
    gradient_outputs: Mapping[int, str] = field(default_factory=lambda: MappingProxyType({}))

    def parameter(self, number: int) -> str | None:
        return self.parameters.get(number)

    def gradient_output(self, position: int) -> str | None:
        return self.gradient_outputs.get(position)

    def element(self, loop: str, index: int) -> str | None:
        return self.elements.get((loop, index))

    def instruction(self, name: str) -> str | None:
        if name in self.body_values:
            return self.body_values[name]
        return self.op_names.get(name)

    def value(self, label: str) -> str | None:
        """A buffer's label: a carried element `while.1[3]` or an instruction."""
        m = _ELEMENT.match(label)
        if m is not None and (m.group("loop"), int(m.group("index"))) in self.elements:
            return self.element(m.group("loop"), int(m.group("index")))
        return self.instruction(label)

    def pinned(self, annotated: Iterable[str]) -> list[str]:
        """The names of the instructions a placement annotates, once each, in its order (carried values only:
        an annotation's own op_name, e.g. torch_xla's `shard_alike`, names no tensor of the user's)."""
        found = [self.body_values.get(name) for name in annotated]
        return list(dict.fromkeys(n for n in found if n is not None))


def name_table(
    module: HloModule,
    manifest: Manifest | None = None,
    parameter_names: Sequence[str] | None = None,
    gradients: Sequence[StackedGradient] = (),
) -> NameTable:
    """Names for `module`'s values, from its metadata, the client's parameter names and the gradient pairs.

    `parameter_names` are the model's parameter names in its order; without
    them a manifest's parameters give them. `gradients` are the stacked
    gradients `scan_pairs` found, in the same (inlined) module.
    """
    names = list(parameter_names) if parameter_names is not None else None
    if names is None and manifest is not None:
        names = [p.name for p in manifest.parameters]
    loops = while_loops(module)
    by_body = {loop.body: loop for loop in loops}
    entry = module.entry
    parameters = _named_stacks(module, loops, names, manifest) if names else {}
    for inst in entry.parameters:
        number = inst.parameter_number or 0
        if number not in parameters and inst.metadata is not None:
            short = short_op_name(inst.metadata.op_name)
            if short is not None:
                parameters[number] = short
    builder = _Elements(module, loops, parameters, {g.key: g for g in gradients})
    elements = {
        (loop.name, i): element
        for loop in loops
        for i in range(loop.tuple_arity)
        if (element := builder.name(loop, i)) is not None
    }
    body_values: dict[str, str] = {}
    for body, loop in by_body.items():
        body_values.update(_body_values(module.computation(body), loop, elements))
    op_names = {
        inst.name: short
        for comp in module.computations
        for inst in comp.instructions
        if inst.metadata is not None and (short := short_op_name(inst.metadata.op_name)) is not None
    }
    for inst in entry.parameters:
        if (inst.parameter_number or 0) in parameters:
            op_names[inst.name] = parameters[inst.parameter_number or 0]
    outputs = {i: name for i, name in enumerate(manifest.outputs) if name} if manifest is not None else {}
    return NameTable(
        MappingProxyType(parameters),
        MappingProxyType(elements),
        MappingProxyType(body_values),
        MappingProxyType(op_names),
        MappingProxyType(outputs),
    )


def _named_stacks(
    module: HloModule, loops: Sequence[WhileLoop], names: list[str], manifest: Manifest | None
) -> dict[int, str]:
    """Entry parameter numbers named from the model's parameter order, through the scan's stacks."""
    stacks = _stacks(module, loops)
    groups: dict[str, list[tuple[int, str]]] = {}
    for name in names:
        split = without_layer(name)
        if split is not None:
            groups.setdefault(split[0], []).append((split[1], name))
    if len(groups) != len(stacks) or any(len(g) != len(s) for g, s in zip(groups.values(), stacks)):
        return {}
    shapes = {p.name: tuple(p.shape) for p in manifest.parameters} if manifest is not None else {}
    entry = module.entry
    named: dict[int, str] = {}
    for group, stack in zip(groups.values(), stacks):
        for (_, name), number in zip(sorted(group), stack):
            param = next(p for p in entry.parameters if p.parameter_number == number)
            if name in shapes and isinstance(param.shape, ArrayShape) and shapes[name] != param.shape.dims:
                raise ValueError(
                    f"parameter {name!r} has shape={list(shapes[name])}, but the entry parameter it is stacked as "
                    f"({param.name}) is {param.shape.to_text(False)}"
                )
            named[number] = name
    return named


def _stacks(module: HloModule, loops: Sequence[WhileLoop]) -> list[list[int]]:
    """Per stacked value a scan reads, in carried order: the entry parameters it stacks, layer by layer."""
    entry = module.entry
    found: dict[str, list[int]] = {}
    for loop in loops:
        if loop.computation != entry.name:
            continue
        init = entry[loop.instruction.operands[0]]
        if init.opcode != "tuple":
            continue
        invariant = invariant_elements(module.computation(loop.body))
        for i in sorted(invariant):
            if not is_stacked(entry[init.operands[i]].shape, loop.trip_count):
                continue
            stack = entry[_through(entry, init.operands[i])]
            if stack.opcode != "concatenate" or stack.attr("dimensions") != (0,) or stack.name in found:
                continue
            layers = [entry[_through(entry, o)] for o in stack.operands]
            if all(p.opcode == "parameter" for p in layers):
                found[stack.name] = [p.parameter_number or 0 for p in layers]
    return list(found.values())


def _through(comp: Computation, name: str) -> str:
    """Back through carriers and Sharding custom-calls to the value they carry."""
    for _ in range(_MAX_TRACE):
        inst = comp[name]
        if not _carries(inst, comp):
            return name
        name = inst.operands[0]
    return name


def _carries(inst: Instruction, comp: Computation) -> bool:
    """Whether `inst` is its one operand, re-laid out, converted, annotated or given size-1 dims."""
    if len(inst.operands) != 1:
        return False
    if inst.opcode == "broadcast":
        shape, source = inst.shape, comp[inst.operands[0]].shape
        return (
            isinstance(shape, ArrayShape)
            and isinstance(source, ArrayShape)
            and shape.num_elements == source.num_elements
        )
    return inst.opcode in _CARRIERS or inst.opcode == "custom-call"


class _Elements:
    """Names carried elements, following one element to another (a residual to the loop that wrote it)."""

    def __init__(
        self,
        module: HloModule,
        loops: Sequence[WhileLoop],
        parameters: Mapping[int, str],
        gradients: Mapping[str, StackedGradient],
    ) -> None:
        self.module = module
        self.loops = {loop.name: loop for loop in loops}
        self.by_body = {loop.body: loop for loop in loops}
        self.parameters = parameters
        self.gradients = gradients
        self.memo: dict[tuple[str, int], str | None] = {}

    def name(self, loop: WhileLoop, index: int) -> str | None:
        key = (loop.name, index)
        if key not in self.memo:
            self.memo[key] = None  # a cycle names nothing
            self.memo[key] = self._name(loop, index)
        return self.memo[key]

    def _name(self, loop: WhileLoop, index: int) -> str | None:
        gradient = self.gradients.get(f"{loop.name}[{index}]")
        if gradient is not None:
            return self._gradient(gradient)
        body = self.module.computation(loop.body)
        comp = self.module.computation(loop.computation)
        init = comp[loop.instruction.operands[0]]
        if init.opcode == "tuple" and index < len(init.operands):
            fed = self._source(comp, init.operands[index], index in invariant_elements(body))
            if fed is not None:
                return fed
        return self._written(body, index) or self._saved(loop, body, index)

    def _gradient(self, gradient: StackedGradient) -> str | None:
        if gradient.matched_by == "manifest" and gradient.name is not None:
            return f"grad of {gradient.name}"
        parameter = gradient.parameter
        if gradient.matched_by not in ("output", "position") or parameter is None:
            return None  # paired by shape alone: a guess, not a name
        name = self.name(self.loops[parameter.loop], parameter.index)
        return f"grad of {name}" if name is not None else None

    def _source(self, comp: Computation, name: str, read_only: bool) -> str | None:
        """What an initial value is: another loop's result, or (for a read-only element) a parameter or stack."""
        element: int | None = None
        for _ in range(_MAX_TRACE):
            inst = comp[name]
            if inst.opcode == "get-tuple-element":
                source = comp[inst.operands[0]]
                if source.opcode == "while" and source.name in self.loops:
                    return self.name(self.loops[source.name], inst.attr("index"))
                outer = self.by_body.get(comp.name)
                if read_only and outer is not None and source.opcode == "parameter" and element is None:
                    # A loop nested in another's body (a layer scan inside a scan over microbatches) reads
                    # what the outer loop carries unchanged: the outer element's own value.
                    index = inst.attr("index")
                    if index in invariant_elements(comp):
                        return self.name(outer, index)
                    return None
                name, element = inst.operands[0], inst.attr("index")
            elif inst.opcode == "tuple" and element is not None:
                name, element = inst.operands[element], None
            elif _carries(inst, comp) and element is None:
                name = inst.operands[0]
            elif not read_only or element is not None or comp.name != self.module.entry_name:
                return None
            elif inst.opcode == "parameter":
                return self.parameters.get(inst.parameter_number or 0)
            elif inst.opcode == "concatenate" and inst.attr("dimensions") == (0,):
                layers = [comp[_through(comp, o)] for o in inst.operands]
                if not all(p.opcode == "parameter" for p in layers):
                    return None
                named = [self.parameters.get(p.parameter_number or 0) for p in layers]
                return stacked_name([n for n in named if n is not None]) if all(named) else None
            else:
                return None
        return None

    def _written(self, body: Computation, index: int) -> str | None:
        """The value the body writes into the element each iteration: its op_name and source line."""
        root = body.root
        if root.opcode != "tuple" or index >= len(root.operands):
            return None
        inst = body[root.operands[index]]
        if not isinstance(inst.shape, ArrayShape) or inst.shape.rank == 0:
            return None  # a counter or scalar accumulator: nothing the user named
        if inst.opcode == "dynamic-update-slice":
            inst = body[_producer(body, inst.operands[1])]
        return _located(self.module, inst)

    def _saved(self, loop: WhileLoop, body: Computation, index: int) -> str | None:
        """A stacked element the body fills one layer per iteration with what the backward reads: one of the
        layer's own inputs (torch_xla's scan keeps each layer's weights, transposed, for its backward) or a value
        it computes, an activation. Named only where another loop reads the stack."""
        root = body.root
        if root.opcode != "tuple" or index >= len(root.operands) or not body.parameters:
            return None
        written = body[root.operands[index]]
        comp = self.module.computation(loop.computation)
        if written.opcode != "dynamic-update-slice" or not _reaches_another_loop(comp, loop, index):
            return None
        source = body[_producer(body, written.operands[1], through_slices=True)]
        scaled = False
        for _ in range(_MAX_TRACE):
            unscaled = _unscaled(body, source)
            if unscaled is None:
                break
            source, scaled = body[_producer(body, unscaled, through_slices=True)], True
        if source.opcode == "get-tuple-element" and source.operands[0] == body.parameters[0].name:
            read = source.attr("index")
            if read != index:
                name = self.name(loop, read) or f"{loop.name}[{read}]"
                return f"{'derived from ' if scaled else ''}{name}, kept per layer for the backward"
        return "an activation kept per layer for the backward"


def _producer(comp: Computation, name: str, through_slices: bool = False) -> str:
    """Back through carriers and tuple plumbing (and slices, when asked) to the instruction that computes the
    value."""
    element: int | None = None
    for _ in range(_MAX_TRACE):
        inst = comp[name]
        if inst.opcode == "get-tuple-element" and comp[inst.operands[0]].opcode == "tuple":
            name, element = inst.operands[0], inst.attr("index")
        elif inst.opcode == "tuple" and element is not None:
            name, element = inst.operands[element], None
        elif element is None and (_carries(inst, comp) or (through_slices and inst.opcode in _SLICES)):
            name = inst.operands[0]
        else:
            return name
    return name


def _unscaled(comp: Computation, inst: Instruction) -> str | None:
    """The operand an elementwise op by a scalar scales (`multiply(w, broadcast(c))`), else None."""
    if inst.opcode not in _SCALINGS or len(inst.operands) != 2:
        return None
    for value, scale in (inst.operands, reversed(inst.operands)):
        by = comp[scale]
        if by.opcode == "broadcast" and isinstance(s := comp[by.operands[0]].shape, ArrayShape) and s.rank == 0:
            return value  # type: ignore[no-any-return]
    return None


def _reaches_another_loop(comp: Computation, loop: WhileLoop, index: int) -> bool:
    """Whether element `index` of the loop's result feeds another While in the same computation."""
    frontier = [u for u in comp.users(loop.instruction.name)
                if comp[u].opcode == "get-tuple-element" and comp[u].attr("index") == index]  # fmt: skip
    seen = set(frontier)
    while frontier:
        for user in comp.users(frontier.pop()):
            inst = comp[user]
            if inst.opcode == "while" and user != loop.instruction.name:
                return True
            if user not in seen and (inst.opcode == "tuple" or _carries(inst, comp)) and len(seen) < _MAX_TRACE:
                seen.add(user)
                frontier.append(user)
    return False


def _located(module: HloModule, inst: Instruction) -> str | None:
    """`dot_general at model.py:180`: the shortened op_name, and where the user wrote it when the dump says."""
    if inst.metadata is None:
        return None
    short = short_op_name(inst.metadata.op_name)
    where = source_location(module, inst)
    op = inst.metadata.op_name
    if where is not None and op and where.endswith(f" ({op})"):
        where = where[: -len(op) - 3]
    elif where == op:
        where = None
    if where is not None:
        where = where.rsplit("/", 1)[-1]
    if short is None:
        return f"value at {where}" if where else None
    return f"{short} at {where}" if where else short


def _body_values(body: Computation, loop: WhileLoop, elements: Mapping[tuple[str, int], str]) -> dict[str, str]:
    """Names of body instructions that are (one layer of) a carried element: read from it, or written into it.

    A read follows the element through slices and carriers; torch_xla's
    backward re-stacks per-layer weights it carries one by one
    (`concatenate(reshape(gte(param, 57)), ...)`), which reads as the stack's name.
    """
    found: dict[str, str] = {}
    if not body.parameters:
        return found
    param = body.parameters[0].name

    def read(start: str, name: str) -> None:
        found.setdefault(start, name)
        frontier = [start]
        while frontier:
            value = frontier.pop()
            for user in body.users(value):
                u = body[user]
                sliced = u.opcode in ("slice", "dynamic-slice") and u.operands[0] == value
                if (sliced or _carries(u, body)) and user not in found:
                    found[user] = name
                    frontier.append(user)

    reads: dict[str, str] = {}
    for gte in body.users(param):
        inst = body[gte]
        name = elements.get((loop.name, inst.attr("index"))) if inst.opcode == "get-tuple-element" else None
        if name is not None:
            reads[gte] = name
            read(gte, name)
    for inst in body.instructions:
        if inst.opcode == "concatenate" and inst.attr("dimensions") == (0,) and inst.name not in found:
            layers = [reads.get(_through(body, o)) for o in inst.operands]
            stacked = stacked_name([n for n in layers if n is not None]) if all(layers) else None
            if stacked is not None:
                read(inst.name, stacked)
    root = body.root
    if root.opcode != "tuple":
        return found
    for i, operand in enumerate(root.operands):
        written = elements.get((loop.name, i))
        if body[operand].opcode != "dynamic-update-slice" or written is None:
            continue
        found[operand] = written
        name, element = body[operand].operands[1], None
        for _ in range(_MAX_TRACE):
            inst = body[name]
            if inst.opcode == "get-tuple-element":
                name, element = inst.operands[0], inst.attr("index")
                continue
            if inst.opcode == "tuple" and element is not None:
                name, element = inst.operands[element], None
                continue
            if element is not None:
                break
            found.setdefault(name, written)
            if not _carries(inst, body):
                break
            name = inst.operands[0]
    return found

"""A Shardy module in GSPMD's terms: the reading plans, placements and the memory model speak of.

Shardy modules are propagated by Shardy's own rules (`planner.propagation.shardy`) on the module as
written; its decisions come back as HloShardings over this reading of it. What Shardy writes maps
onto GSPMD's vocabulary as follows:
- `xla.sdy.sharding` on an instruction with no `sharding=`: that sharding, as
  an HloSharding (JAX writes both forms; XLA's own Shardy dumps may carry only
  the Shardy one);
- a `Sharding` custom-call whose Shardy sharding has open dims (`{?}`,
  `{"x", ?}`): those dims become GSPMD's `unspecified_dims`, which JAX writes
  for the same constraint under GSPMD (`P.UNCONSTRAINED`);
- `xla.sdy.FuncResultSharding` (the function's result sharding): the entry root's sharding of
  that result, the custom-call gone, as XLA's Shardy import makes it the function's result sharding
  and returns the operand itself; only where it is not the result (or leaves dims open) a `Sharding`
  custom-call;
- `xla.sdy.ShardingGroup` (shard_alike): its operand joins a `shard_as`
  group, numbered after the groups the module already has.
The module's mesh (`xla.sdy.meshes`) gives the planner the mesh axes' names
and sizes.

Newer XLA writes Shardy shardings natively in `sharding=` (`{mesh['fsdp'=4,'tp'=2], [...]}`,
`planner.sharding.named_text`), the mesh inline: the parser reads them as the HloSharding they
place data by, the meshes they name are the module's, and open dims of a `Sharding`
custom-call become `unspecified_dims` as above.
"""

from __future__ import annotations

import dataclasses

from planner.errors import UnsupportedHlo
from planner.hlo.ir.frontend_attributes import MESHES, FrontendAttributes
from planner.hlo.ir.module import Attribute, Computation, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape, TupleShape
from planner.hlo.text.mesh_inference import infer_mesh, named_meshes
from planner.mesh import Mesh
from planner.sharding.hlo_sharding import HloSharding, ShardGroup
from planner.sharding.named_text import NamedSharding
from planner.sharding.partition_spec import spec_axes, spec_from_sharding
from planner.sharding.shardy import AxisRef, DimSharding, SdyMesh, TensorSharding, to_hlo_sharding

GSPMD = "gspmd"
SHARDY = "shardy"
FUNC_RESULT_SHARDING = "xla.sdy.FuncResultSharding"
SHARDING_GROUP = "xla.sdy.ShardingGroup"
# shard_map's round trip: the body is a call between these two custom calls.
GLOBAL_TO_LOCAL = "xla.sdy.GlobalToLocalShape"
LOCAL_TO_GLOBAL = "xla.sdy.LocalToGlobalShape"
MANUAL_BODY_PREFIX = "xla.sdy.manual_computation_body"


def module_meshes(module: HloModule) -> dict[str, SdyMesh]:
    """The meshes the module declares (`xla.sdy.meshes`), else those its native shardings name inline
    (named `mesh`, `mesh_1`, ... in order of appearance)."""
    attrs = module.attr("frontend_attributes")
    if isinstance(attrs, FrontendAttributes) and attrs.sdy_meshes:
        return attrs.sdy_meshes
    inline: dict[SdyMesh, str] = {}
    for comp in module.computations:
        for inst in comp.instructions:
            for named in named_shardings(inst):
                if named is not None:
                    inline.setdefault(named.mesh, "mesh" if not inline else f"mesh_{len(inline)}")
    if inline:
        return {name: mesh for mesh, name in inline.items()}
    return _undeclared_mesh(module)


def _undeclared_mesh(module: HloModule) -> dict[str, SdyMesh]:
    """The one mesh Shardy shardings name without the module declaring it (jax 0.12's HLO text), when the
    GSPMD shardings beside them pin it down (`planner.hlo.text.mesh_inference`)."""
    names = named_meshes(module)
    num_partitions = module.attr("num_partitions")
    if len(names) != 1 or not isinstance(num_partitions, int):
        return {}
    mesh = infer_mesh(module, num_partitions)
    return {} if mesh is None else {next(iter(names)): mesh}


def named_shardings(inst: Instruction) -> tuple[NamedSharding | None, ...]:
    """The Shardy shardings `inst`'s `sharding=` writes natively, one per result (None for a result written
    the classic way; one sharding on a tuple stands for every element, as in XLA); empty when it has no
    sharding. Read from the typed sharding the parser made (`HloSharding.named`), never from its text."""
    sharding = inst.sharding
    if sharding is None:
        return ()
    return tuple(element.named for element in (sharding.elements if sharding.is_tuple else (sharding,)))


def shardy_constraint(
    sharding: HloSharding,
    rank: int,
    meshes: dict[str, SdyMesh],
    open_dims: tuple[int, ...] = (),
    declared: bool = True,
) -> TensorSharding | None:
    """The Shardy sharding that places data as `sharding` does on the module's one mesh: what
    `with_sharding_constraint(x, P(...))` writes, closed but for `open_dims` (`P.UNCONSTRAINED`). None
    when the module has several meshes or `sharding` is no tiling of its mesh."""
    if sharding.is_tuple or len(meshes) != 1:
        return None
    ((name, mesh),) = meshes.items()
    # A module that declares no mesh (XLA's own dump writes each sharding's mesh inline) gets it inline.
    mesh_ref: str | SdyMesh = name if declared else mesh
    grid = Mesh(tuple(s for _, s in mesh.axes), tuple(n for n, _ in mesh.axes), mesh.device_ids)
    try:
        spec = spec_from_sharding(sharding, rank, grid)
    except ValueError:
        return None
    dims = tuple(
        DimSharding(tuple(AxisRef(a) for a in spec_axes(entry)), is_open=d in open_dims) for d, entry in enumerate(spec)
    )
    return TensorSharding(mesh_ref, dims)


def declares_meshes(module: HloModule) -> bool:
    """Whether the module names its meshes (`xla.sdy.meshes`), as JAX's lowered text does."""
    attrs = module.attr("frontend_attributes")
    return isinstance(attrs, FrontendAttributes) and bool(attrs.sdy_meshes)


def sdy_sharding_attribute(values: tuple[TensorSharding, ...]) -> Attribute:
    """`frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[...]>"}`, as JAX's round trip writes it."""
    text = "#sdy.sharding_per_value<[" + ", ".join(v.to_text() for v in values) + "]>"
    items = (("xla.sdy.sharding", text),)
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return Attribute(
        "frontend_attributes",
        FrontendAttributes(items, sdy_sharding=values),
        '{xla.sdy.sharding="' + escaped + '"}',
    )


def partitioner_of(module: HloModule) -> str:
    """`shardy` when the module carries Shardy's attributes or shardings, else `gspmd`."""
    if module_meshes(module):
        return SHARDY
    for comp in module.computations:
        for inst in comp.instructions:
            attrs = inst.attr("frontend_attributes")
            if isinstance(attrs, FrontendAttributes) and (attrs.sdy_sharding or attrs.sdy_group is not None):
                return SHARDY
    return GSPMD


def module_mesh(module: HloModule) -> Mesh | None:
    """The module's one device mesh, when it declares exactly one (maximal meshes aside)."""
    meshes = {name: m for name, m in module_meshes(module).items() if m.axes and not m.is_maximal}
    distinct = {(m.axes, m.device_ids) for m in meshes.values()}
    if len(distinct) != 1:
        return None
    mesh = next(iter(meshes.values()))
    return Mesh(tuple(s for _, s in mesh.axes), tuple(n for n, _ in mesh.axes), mesh.device_ids)


def resolve_mesh(module: HloModule, given: Mesh | None) -> Mesh | None:
    """The mesh to plan with: the module's own when it has one; a different `given` mesh is an error."""
    own = module_mesh(module)
    if own is None:
        return given
    if given is not None and (given.shape, given.axis_names, given.device_ids) != (
        own.shape,
        own.axis_names,
        own.device_ids,
    ):
        raise ValueError(
            f"--mesh {given.to_text()} conflicts with the mesh the module declares "
            f"({MESHES}: {own.to_text()}); leave --mesh out or make them agree"
        )
    return own


def to_gspmd(module: HloModule) -> tuple[HloModule, dict[str, str]]:
    """`module` with its Shardy attributes carried over to GSPMD's (see the module docstring), and the
    instructions that went, each to the instruction that now stands for it."""
    if partitioner_of(module) != SHARDY:
        return module, {}
    meshes = module_meshes(module)
    module, gone = _results_on_root(module, meshes)
    next_group = [_max_group_id(module) + 1]
    group_ids: dict[int, int] = {}
    computations = []
    for comp in module.computations:
        insts = tuple(_convert(comp, inst, meshes, group_ids, next_group) for inst in comp.instructions)
        computations.append(dataclasses.replace(comp, instructions=insts))
    return dataclasses.replace(module, computations=tuple(computations)), gone


def _results_on_root(module: HloModule, meshes: dict[str, SdyMesh]) -> tuple[HloModule, dict[str, str]]:
    """The entry's `FuncResultSharding` calls that only the root tuple reads, moved onto the root.

    XLA's Shardy import (`sdy_round_trip/import_shardings.cc`) turns each into the function's result
    sharding, sets the operand in its place and erases the call: the sharding is the output's, not
    the operand's. Read as a `Sharding` custom-call instead, it would pin the operand, which XLA's
    own dump of the same compile (results' shardings on the root tuple) does not: the two forms
    would propagate differently. Its other readers (JAX's dead `reshape` carrying the GSPMD form of
    the same sharding) read the operand, as in that dump. A call with open dims stays a `Sharding`
    custom-call (its open dims then GSPMD's unspecified dims); so does a root that is the call itself
    (its copy is then the output, with the output's sharding, as XLA's dump writes it).
    """
    entry = module.entry
    root = entry.root
    if root.opcode != "tuple":
        return module, {}
    operands = list(root.operands)
    element_shardings = _root_element_shardings(root)
    gone: dict[str, str] = {}
    for k, name in enumerate(operands):
        inst = entry[name]
        sharding = _result_sharding(inst, meshes)
        if sharding is None:
            continue
        gone[name] = inst.operands[0]
        operands[k] = inst.operands[0]
        if element_shardings[k] is None:
            element_shardings[k] = sharding
    if not gone:
        return module, {}
    attrs = [a for a in root.attributes if a.key != "sharding"]
    if all(s is not None for s in element_shardings):
        attrs.append(_sharding(HloSharding.tuple_of(tuple(s for s in element_shardings if s is not None))))
    new_root = dataclasses.replace(root, operands=tuple(operands), attributes=tuple(attrs))
    instructions = tuple(
        new_root if i.name == root.name else _reading_through(i, gone) for i in entry.instructions if i.name not in gone
    )
    comp = dataclasses.replace(entry, instructions=instructions)
    computations = tuple(comp if c.name == entry.name else c for c in module.computations)
    return dataclasses.replace(module, computations=computations), gone


def _reading_through(inst: Instruction, gone: dict[str, str]) -> Instruction:
    """`inst` reading, in place of each erased call, that call's operand."""
    if not any(o in gone for o in inst.operands):
        return inst
    return dataclasses.replace(inst, operands=tuple(gone.get(o, o) for o in inst.operands))


def is_func_result(inst: Instruction) -> bool:
    """Whether `inst` is an `xla.sdy.FuncResultSharding` call: how JAX returns an output it pins."""
    return inst.opcode == "custom-call" and inst.attr("custom_call_target") == FUNC_RESULT_SHARDING


def leaves_dims_open(inst: Instruction) -> bool:
    """Whether `inst`'s Shardy sharding leaves a dim open (`{?}`, `{"x", ?}`) for propagation to extend."""
    attrs = inst.attr("frontend_attributes")
    return isinstance(attrs, FrontendAttributes) and any(value.open_dims for value in attrs.sdy_sharding or ())


def _result_sharding(inst: Instruction, meshes: dict[str, SdyMesh]) -> HloSharding | None:
    """The result sharding a `FuncResultSharding` call gives, when it closes every dim."""
    if not is_func_result(inst) or leaves_dims_open(inst):
        return None
    attrs = inst.attr("frontend_attributes")
    if inst.sharding is not None or not isinstance(attrs, FrontendAttributes) or not attrs.sdy_sharding:
        return inst.sharding
    return _hlo_sharding(inst, attrs.sdy_sharding, meshes)


def _root_element_shardings(root: Instruction) -> list[HloSharding | None]:
    """Per element of a root tuple, the sharding it carries (None: none)."""
    s = root.sharding
    if s is None:
        return [None] * len(root.operands)
    if s.is_tuple and len(s.elements) == len(root.operands):
        return list(s.elements)
    return [s] * len(root.operands)


def _convert(
    comp: Computation, inst: Instruction, meshes: dict[str, SdyMesh], groups: dict[int, int], next_group: list[int]
) -> Instruction:
    attrs = inst.attr("frontend_attributes")
    target = inst.attr("custom_call_target") if inst.opcode == "custom-call" else None
    if not isinstance(attrs, FrontendAttributes):
        if target == "Sharding" and not inst.has_attr("backend_config"):
            native = named_shardings(inst)
            if len(native) == 1 and native[0] is not None:
                return _with_open_dims(inst, native[0].sharding.open_dims)
        return inst
    if target == SHARDING_GROUP and attrs.sdy_group is not None:
        gid = groups.setdefault(attrs.sdy_group, next_group[0])
        next_group[0] = max(next_group[0], gid + 1)
        # The group marker's own shape is `()`; as a Sharding custom-call it takes its operand's.
        operand_shape = comp[inst.operands[0]].shape
        sharding = HloSharding.unknown().with_shard_group(ShardGroup(gid, shard_as=True))
        return dataclasses.replace(
            inst,
            shape=operand_shape,
            attributes=(_word("custom_call_target", "Sharding"), _sharding(sharding)),
        )
    if attrs.sdy_sharding is None:
        return inst
    attributes = list(inst.attributes)
    if inst.sharding is None:
        attributes.append(_sharding(_hlo_sharding(inst, attrs.sdy_sharding, meshes)))
    if target == FUNC_RESULT_SHARDING:
        attributes = [_word("custom_call_target", "Sharding") if a.key == "custom_call_target" else a
                      for a in attributes if a.key != "custom_call_has_side_effect"]  # fmt: skip
        target = "Sharding"
    inst = dataclasses.replace(inst, attributes=tuple(attributes))
    if target == "Sharding" and not inst.has_attr("backend_config"):
        inst = _with_open_dims(inst, attrs.sdy_sharding[0].open_dims if len(attrs.sdy_sharding) == 1 else ())
    return inst


def _with_open_dims(inst: Instruction, open_dims: tuple[int, ...]) -> Instruction:
    """A `Sharding` custom-call whose open dims are GSPMD's `unspecified_dims` (JAX's P.UNCONSTRAINED)."""
    if not open_dims:
        return inst
    text = f'"unspecified_dims=[{",".join(map(str, open_dims))}]"'
    return dataclasses.replace(inst, attributes=(*inst.attributes, Attribute("backend_config", text[1:-1], text)))


def _hlo_sharding(inst: Instruction, values: tuple[TensorSharding, ...], meshes: dict[str, SdyMesh]) -> HloSharding:
    leaves = inst.shape.leaves() if isinstance(inst.shape, TupleShape) else (inst.shape,)
    if len(values) != len(leaves):
        raise UnsupportedHlo(
            f"line {inst.line}: '{inst.name}' has {len(values)} Shardy shardings for {len(leaves)} results"
        )
    try:
        converted = [to_hlo_sharding(v, meshes, leaf.rank) for v, leaf in zip(values, leaves)
                     if isinstance(leaf, ArrayShape)]  # fmt: skip
    except ValueError as e:
        raise UnsupportedHlo(f"line {inst.line}: the Shardy sharding of '{inst.name}': {e}") from None
    if isinstance(inst.shape, TupleShape):
        return HloSharding.tuple_of(tuple(converted))
    return converted[0]


def _sharding(sharding: HloSharding) -> Attribute:
    return Attribute("sharding", sharding, sharding.to_text())


def _word(key: str, value: str) -> Attribute:
    return Attribute(key, value, f'"{value}"')


def _max_group_id(module: HloModule) -> int:
    ids = [
        e.shard_group.id
        for comp in module.computations
        for inst in comp.instructions
        if inst.sharding is not None
        for e in (inst.sharding.elements if inst.sharding.is_tuple else (inst.sharding,))
        if e.shard_group is not None
    ]
    return max(ids, default=-1)


__all__ = [
    "GSPMD",
    "SHARDY",
    "is_func_result",
    "leaves_dims_open",
    "module_mesh",
    "partitioner_of",
    "resolve_mesh",
    "to_gspmd",
]

"""The module as Shardy sees it: values with one sharding each, ops between them, and data-flow edges.

XLA hands Shardy a StableHLO module converted from HLO, where tuples are gone: a While carries N
values, its body and condition take N block arguments, and a `get-tuple-element` or `tuple` is just a
name for a value. Built from our HLO IR the same way:

- every array leaf of an instruction's result is a `Value`; `tuple` and `get-tuple-element` only name
  values (no op), as do the parameters of called computations that are inlined;
- a While's result i, its body argument i and its condition argument i are one value, whose sharding
  the data-flow edge of result i owns (Shardy's `sdy.data_flow_edge`): the edge propagates from its
  *sources* (the init operand and the body's returned value) to that value like an identity op. A
  conditional's results are edges from each branch's returned value; branch parameters are the
  branch operands themselves (StableHLO's `case` regions capture them);
- JAX's round-trip custom calls become Shardy's ops: `Sharding` a sharding constraint,
  `xla.sdy.PropagationBarrier` a barrier, `xla.sdy.ShardingGroup` a group membership (no op), and
  `xla.sdy.FuncResultSharding` the function's result sharding (no op);
- every other instruction is an op whose sharding rule the registry gives (or none: it blocks).

Uses are kept in program order; Shardy's notifications walk MLIR use lists, newest use first.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from planner.errors import UnsupportedHlo
from planner.hlo.ir.frontend_attributes import FrontendAttributes
from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape, Shape, TupleShape
from planner.hlo.structure.inline import inlineable
from planner.hlo.text.shardy_import import (
    GLOBAL_TO_LOCAL,
    LOCAL_TO_GLOBAL,
    MANUAL_BODY_PREFIX,
    named_shardings,
    shardy_constraint,
)
from planner.propagation.shardy.factor_propagation import Direction
from planner.propagation.shardy.manual import add_free_axes, erase_manual_axes
from planner.propagation.shardy.manual_hlo import in_shardings_of, manual_axes_of, out_shardings_of
from planner.propagation.shardy.release import ShardyRelease
from planner.propagation.shardy.rule import OpShardingRule
from planner.sharding.shardy import DimSharding, SdyMesh, TensorSharding


class OpKind(enum.Enum):
    """What an op is to the driver: Shardy asks an op through its traits (`ShardableDataFlowOpInterface`,
    `PropagationBarrierOp`, `ShardingConstraintOp`) rather than by its name."""

    RULE = "rule"  # propagates by its registry rule (or blocks, with none)
    EDGE = "edge"  # a data-flow edge: its owner exchanges shardings with its sources as an identity
    BARRIER = "barrier"  # `sdy.propagation_barrier`: an identity that lets shardings through one way
    CONSTRAINT = "constraint"  # a sharding constraint the import adds (a written one is a RULE op)


RULE, EDGE, BARRIER, CONSTRAINT = OpKind.RULE, OpKind.EDGE, OpKind.BARRIER, OpKind.CONSTRAINT
# Custom calls that JAX's Shardy round trip writes and the import turns back into Shardy constructs.
SHARDING_CONSTRAINT = "Sharding"
FUNC_RESULT = "xla.sdy.FuncResultSharding"
GROUP = "xla.sdy.ShardingGroup"
BARRIER_TARGET = "xla.sdy.PropagationBarrier"


class Value:
    __slots__ = (
        "array",
        "defining",
        "dims",
        "extra_uses",
        "index",
        "instruction",
        "name",
        "origin",
        "sharding",
        "target_uses",
        "uses",
    )

    def __init__(self, index: int, name: str, dims: tuple[int, ...] | None, array: ArrayShape | None = None) -> None:
        self.index = index
        self.name = name
        self.instruction = name  # the instruction whose result (or result element) it is
        self.dims = dims  # None: not a static array (a token)
        self.array = array
        self.sharding: TensorSharding | None = None
        self.defining: Op | None = None
        self.uses: list[Op] = []  # ops reading it, program order
        self.target_uses: list[Op] = []  # ops reading it as a body/condition argument of its edge
        # Uses that are not ops here: the function's return, sharding-group membership.
        self.extra_uses = 0
        # Why the value has its sharding: the last change's reason and the instructions it came from.
        self.origin: Origin = Origin("annotation")

    @property
    def is_scalar(self) -> bool:
        return self.dims is not None and len(self.dims) == 0

    def __repr__(self) -> str:
        return f"Value({self.name})"


@dataclass(frozen=True)
class Origin:
    """Why a value holds its sharding: as written (`annotation`), or the step that last changed it
    (`aggressive propagation through dot, op-priority step 2`) and the instructions it read."""

    reason: str
    sources: tuple[str, ...] = ()


@dataclass(eq=False)
class Op:
    kind: OpKind
    name: str
    loc: str
    operands: list[Value]
    results: list[Value]
    inst: Instruction | None = None
    rule: OpShardingRule | None = None
    rule_known: bool = False
    allowed: Direction = Direction.BOTH
    is_elementwise: bool = False
    computation: Computation | None = None  # the one holding `inst`: some rules read its operands' producers
    as_written: tuple[TensorSharding, ...] | None = None
    # Block arguments that alias an edge's result (while body/condition), for notifications.
    targets: list[Value] = field(default_factory=list)
    # A manual computation's edge sees its owner through these (None: as it is).
    before: Callable[[TensorSharding | None], TensorSharding | None] | None = None
    after: Callable[[TensorSharding], TensorSharding] | None = None

    @property
    def is_sharding_constraint(self) -> bool:
        """A `Sharding` custom call the module writes (`sdy.sharding_constraint`), not an edge of its value."""
        return (
            self.kind is not EDGE
            and self.inst is not None
            and self.inst.opcode == "custom-call"
            and self.inst.attr("custom_call_target") == SHARDING_CONSTRAINT
        )

    def __repr__(self) -> str:
        return f"Op({self.kind} {self.name})"


@dataclass(eq=False)
class SharedCallee:
    """A function built once for all its calls (Shardy's `dedup-functions-fully`): its arguments, what it
    returns, and the function data-flow edge on each argument (None where an argument has none)."""

    args: list[Tree]
    returned: Tree
    arg_edges: list[Op | None]


@dataclass(eq=False)
class Leaf:
    """A value as one element of an instruction's result, with the function-result sharding it carries."""

    value: Value
    func_result: TensorSharding | None = None


Tree = Leaf | list["Tree"]


@dataclass
class FuncResult:
    value: Value
    sharding: TensorSharding | None


@dataclass(eq=False)
class ManualComputation:
    """One `shard_map`: its body arguments and results (edge owners) and the shardings around them."""

    loc: str
    manual_axes: tuple[str, ...]
    in_shardings: list[TensorSharding]
    out_shardings: list[TensorSharding] = field(default_factory=list)
    arguments: list[Value] = field(default_factory=list)
    results: list[Value] = field(default_factory=list)

    def current_in_shardings(self) -> list[TensorSharding]:
        return [
            add_free_axes(outer, arg.sharding, self.manual_axes) if arg.sharding is not None else outer
            for outer, arg in zip(self.in_shardings, self.arguments, strict=True)
        ]

    def current_out_shardings(self) -> list[TensorSharding]:
        return [r.sharding or outer for outer, r in zip(self.out_shardings, self.results, strict=True)]


@dataclass
class Program:
    meshes: dict[str, SdyMesh]
    # The Shardy whose rules the ops follow (the jaxlib that compiles the module carries it).
    release: ShardyRelease = field(default_factory=ShardyRelease.installed)
    # The module the program was built from: a rule may read another of its computations (a scatter's update).
    module: HloModule | None = None
    values: list[Value] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    args: list[Value] = field(default_factory=list)
    results: list[FuncResult] = field(default_factory=list)
    groups: dict[int, list[Value]] = field(default_factory=dict)
    # Ops by instruction name, for reporting.
    by_instruction: dict[str, Op] = field(default_factory=dict)
    # Instruction name -> the values of its result leaves.
    leaves: dict[str, list[Value]] = field(default_factory=dict)
    manual: list[ManualComputation] = field(default_factory=list)
    # A value split per use by the import (`constant_splitting`) -> the value it was split from.
    split_from: dict[int, Value] = field(default_factory=dict)
    # Per loop, branch or barrier location: all its results (tokens included), edges or not.
    edge_results: dict[str, list[Value]] = field(default_factory=dict)
    # Per named computation location: its block arguments and its results, each an edge's owner.
    named: dict[str, tuple[list[Value], list[Value]]] = field(default_factory=dict)
    # Per named computation location: its in_shardings and out_shardings as written (None: not written).
    named_written: dict[str, tuple[tuple[TensorSharding | None, ...], tuple[TensorSharding | None, ...]]] = field(
        default_factory=dict
    )

    def location_of(self, value: Value) -> str:
        """Where `value` is written (MLIR's `Value::getLoc`): its defining op's location, a block argument's
        own (a parameter's, kept by the converter as its metadata `op_name`), else its name."""
        if value.defining is not None:
            return value.defining.loc
        if self.module is not None:
            for comp in self.module.computations:
                if value.instruction in comp:
                    metadata = comp[value.instruction].metadata
                    return metadata.op_name if metadata is not None and metadata.op_name else value.name
        return value.name

    def mesh_of(self, sharding: TensorSharding) -> SdyMesh:
        """The mesh `sharding` names (or writes inline)."""
        return sharding.mesh if isinstance(sharding.mesh, SdyMesh) else self.meshes[sharding.mesh]

    def map_shardings(self, fn: Callable[[TensorSharding], TensorSharding]) -> None:
        """`fn` applied to every sharding the program holds: its values', its results' and its manual
        computations' in- and out-shardings (a pass over the whole module, as `transformShardings`)."""
        for value in self.values:
            if value.sharding is not None:
                value.sharding = fn(value.sharding)
        for result in self.results:
            if result.sharding is not None:
                result.sharding = fn(result.sharding)
        for manual in self.manual:
            manual.in_shardings = [fn(s) for s in manual.in_shardings]
            manual.out_shardings = [fn(s) for s in manual.out_shardings]

    def new_value(self, name: str, shape: Shape, instruction: str | None = None) -> Value:
        array = shape if isinstance(shape, ArrayShape) else None
        value = Value(len(self.values), name, array.dims if array is not None else None, array)
        value.instruction = instruction or name
        self.values.append(value)
        return value


def _leaves(tree: Tree) -> list[Leaf]:
    if isinstance(tree, Leaf):
        return [tree]
    return [leaf for t in tree for leaf in _leaves(t)]


def _frontend(inst: Instruction) -> FrontendAttributes | None:
    attrs = inst.attr("frontend_attributes")
    return attrs if isinstance(attrs, FrontendAttributes) else None


def _sdy_shardings(inst: Instruction) -> tuple[TensorSharding, ...] | None:
    """What the instruction says Shardy's sharding is: `xla.sdy.sharding` (JAX's round-trip attribute),
    else a Shardy sharding XLA writes natively in `sharding=` (`{mesh['x'=4], [{'x'}, {?}]}`, jax 0.12's
    dumps), its mesh inline."""
    attrs = _frontend(inst)
    if attrs is not None and attrs.sdy_sharding is not None:
        return attrs.sdy_sharding
    named = named_shardings(inst)
    if named and all(n is not None for n in named):
        return tuple(n.sharding for n in named if n is not None)
    return None


def constraint_from_hlo(inst: Instruction, meshes: dict[str, SdyMesh]) -> TensorSharding | None:
    """A `Sharding` call that carries only an HloSharding (written as GSPMD's): the closed constraint that
    places data as it says, on the module's one mesh."""
    sharding = inst.sharding
    if sharding is None or not isinstance(inst.shape, ArrayShape):
        return None
    return shardy_constraint(sharding, inst.shape.rank, meshes)


def _op_name(inst: Instruction) -> str:
    metadata = inst.metadata
    name = metadata.op_name if metadata is not None else None
    return name or inst.name


# Instructions that stay although nothing reads them.
_SIDE_EFFECTING = frozenset({"send", "send-done", "recv", "recv-done", "outfeed", "infeed", "after-all", "rng"})


def _live(comp: Computation, keep_located: bool) -> set[str]:
    """What the root reads, and whatever has a side effect or is a call: Shardy's import erases the rest (its
    canonicalizer drops trivially dead ops), such as the dead `reshape` JAX writes beside a result's
    sharding to carry its GSPMD form.

    `keep_located`: no import runs (a single pass of Shardy's, as its lit tests run them), so a dead op
    stays and propagates; only what the conversion to HLO added (an instruction without a location) goes.
    """
    live: set[str] = set()
    stack = [comp.root_name] + [
        i.name
        for i in comp.instructions
        if i.opcode in _SIDE_EFFECTING
        or (i.opcode == "custom-call" and i.attr("custom_call_has_side_effect"))
        # A call that reaches the import is a `func.call`, which MLIR's canonicalizer keeps: a call may
        # have effects it cannot see.
        or is_named_computation(i)
        or (keep_located and i.metadata is not None and i.metadata.op_name)
    ]
    while stack:
        name = stack.pop()
        if name in live:
            continue
        live.add(name)
        stack.extend(comp[name].operands)
    return live


def _pass_through_elements(body: Computation) -> list[int]:
    """Tuple elements the body returns as it received them (`root[i] = get-tuple-element(param, i)`)."""
    root = body.root
    if root.opcode != "tuple" or not body.parameters:
        return []
    param = body.parameters[0].name
    out = []
    for i, name in enumerate(root.operands):
        inst = body[name]
        if inst.opcode == "get-tuple-element" and inst.operands[0] == param and int(inst.attr("index")) == i:
            out.append(i)
    return out


OrderKey = Callable[[Instruction], int]


class _Builder:
    def __init__(
        self, module: HloModule, program: Program, order_key: OrderKey | None = None, keep_dead: bool = False
    ) -> None:
        self.module = module
        self.p = program
        self.order_key = order_key
        self.keep_dead = keep_dead
        self.manual_stack: list[ManualComputation] = []
        self.current: Computation | None = None
        # `dedup_functions`: one body per callee, whatever its calls (`SharedCallee`); None: one per call.
        self.shared: dict[str, SharedCallee] | None = None

    def order(self, comp: Computation) -> list[Instruction]:
        """The live instructions in program order: as written (XLA's post order, which its importer
        follows), or by `order_key` (kept topological) where the module keeps an order the text lost."""
        live = _live(comp, self.keep_dead)
        insts = [i for i in comp.instructions if i.name in live]
        if self.order_key is None:
            return insts
        placed: set[str] = set()
        ordered: list[Instruction] = []
        by_name = {i.name: i for i in insts}

        def place(inst: Instruction) -> None:
            if inst.name in placed:
                return
            placed.add(inst.name)
            for operand in inst.operands:
                if operand in by_name:
                    place(by_name[operand])
            ordered.append(inst)

        for inst in sorted(insts, key=self.order_key):
            place(inst)
        return ordered

    def fresh(self, inst: Instruction, shape: Shape, suffix: str = "") -> Tree:
        if isinstance(shape, TupleShape):
            return [self.fresh(inst, element, f"{suffix}.{i}") for i, element in enumerate(shape.elements)]
        return Leaf(self.p.new_value(inst.name + suffix, shape, inst.name))

    def add_op(self, op: Op) -> Op:
        self.p.ops.append(op)
        for value in op.operands:
            value.uses.append(op)
        for value in op.results:
            value.defining = op
        return op

    def computation(self, comp: Computation, params: dict[int, Tree]) -> Tree:
        trees: dict[str, Tree] = {}
        outer, self.current = self.current, comp
        for inst in self.order(comp):
            trees[inst.name] = self.instruction(inst, trees, params)
            self.p.leaves.setdefault(inst.name, [leaf.value for leaf in _leaves(trees[inst.name])])
        self.current = outer
        return trees[comp.root_name]

    def instruction(self, inst: Instruction, trees: dict[str, Tree], params: dict[int, Tree]) -> Tree:
        op = inst.opcode
        operands = [trees[name] for name in inst.operands]
        if op == "parameter":
            assert inst.parameter_number is not None
            return params[inst.parameter_number]
        if op == "tuple":
            return list(operands)
        if op == "get-tuple-element":
            source = operands[0]
            assert isinstance(source, list)
            return source[int(inst.attr("index"))]
        if op == "while":
            return self.while_loop(inst, operands[0])
        if op == "conditional":
            return self.conditional(inst, operands)
        if op == "opt-barrier":
            owners = self.fresh(inst, inst.shape)
            self.edges(inst, owners, [operands[0]], [])
            return owners
        if op == "call":
            if is_named_computation(inst):
                return self.named_computation(inst, operands)
            return self.computation(self.module.computation(inst.called_computations[0]), dict(enumerate(operands)))
        if op == "custom-call":
            target = inst.attr("custom_call_target")
            if target == FUNC_RESULT:
                (leaf,) = _leaves(operands[0])
                shardings = _sdy_shardings(inst)
                return Leaf(leaf.value, shardings[0] if shardings else None)
            if target == GROUP:
                group = _frontend(inst)
                gid = group.sdy_group if group is not None else None
                if gid is None:
                    raise UnsupportedHlo(f"{inst.name}: a sharding group without xla.sdy.sharding_group_id")
                for leaf in _leaves(operands[0]):
                    self.p.groups.setdefault(gid, []).append(leaf.value)
                    leaf.value.extra_uses += 1
                return []
            if target == GLOBAL_TO_LOCAL:
                return self.enter_manual(inst, operands)
            if target == LOCAL_TO_GLOBAL:
                return self.leave_manual(inst, operands)
        return self.plain(inst, operands)

    def plain(self, inst: Instruction, operands: list[Tree]) -> Tree:
        result = self.fresh(inst, inst.shape)
        results = [leaf.value for leaf in _leaves(result)]
        shardings = _sdy_shardings(inst)
        if (
            shardings is None
            and inst.opcode == "custom-call"
            and inst.attr("custom_call_target") == SHARDING_CONSTRAINT
        ):
            written = constraint_from_hlo(inst, self.p.meshes)
            shardings = (written,) if written is not None else None
        # Shardings written for an op HLO spells differently (a send or recv with its token and context
        # values, a call with no results) do not map onto its values: kept as written, never propagated.
        as_written = None
        if shardings is not None and len(shardings) != len(results):
            as_written, shardings = shardings, None
        if shardings is not None:
            for value, sharding in zip(results, shardings, strict=True):
                value.sharding = sharding
        kind = RULE
        allowed = Direction.BOTH
        if inst.opcode == "custom-call" and inst.attr("custom_call_target") == BARRIER_TARGET:
            kind = BARRIER
            attrs = _frontend(inst)
            # Written as Shardy's PropagationDirection enum value: `2 : i32` is BACKWARD.
            word = (attrs.get("xla.sdy.allowed_direction") if attrs is not None else None) or "0"
            allowed = Direction(int(word.split(":")[0].strip().strip('"')))
        op = Op(
            kind,
            inst.name,
            _op_name(inst),
            [leaf.value for t in operands for leaf in _leaves(t)],
            results,
            inst=inst,
            allowed=allowed,
            computation=self.current,
            as_written=as_written,
        )
        self.add_op(op)
        self.p.by_instruction[inst.name] = op
        # A reducer, comparator or scatter combiner: a region of the op, its arguments scalars of its own.
        for name in inst.called_computations:
            region = self.module.computation(name)
            params = {i.parameter_number: self.fresh(i, i.shape) for i in region.parameters}
            self.computation(region, params)  # type: ignore[arg-type]
        return result

    def edges(
        self,
        inst: Instruction,
        owners: Tree,
        sources: list[Tree],
        targets: list[Tree],
        shardings: tuple[TensorSharding, ...] | None = None,
    ) -> None:
        """Data-flow edges owning `owners`' values, from `sources`; `shardings` the owners' own (default: the
        ones `inst` writes)."""
        owner_leaves = _leaves(owners)
        defined = {id(leaf.value) for s in sources for leaf in _leaves(s)}
        self.p.edge_results.setdefault(_op_name(inst), []).extend(leaf.value for leaf in owner_leaves)
        source_leaves = [_leaves(s) for s in sources]
        target_leaves = [_leaves(t) for t in targets]
        if shardings is None:
            shardings = _sdy_shardings(inst)
        for i, owner in enumerate(owner_leaves):
            if shardings is not None and i < len(shardings):
                owner.value.sharding = shardings[i]
            if owner.value.dims is None:
                continue  # tokens carry no sharding
            if id(owner.value) in defined:
                continue  # an element the loop passes through unchanged: the value itself, no edge
            edge = Op(
                EDGE,
                f"{inst.name}#{i}",
                _op_name(inst),
                [s[i].value for s in source_leaves],
                [owner.value],
                inst=inst,
                targets=[t[i].value for t in target_leaves],
            )
            self.add_op(edge)

    def while_loop(self, inst: Instruction, init: Tree) -> Tree:
        cond = self.module.computation(inst.attr("condition").names[0])
        body = self.module.computation(inst.attr("body").names[0])
        owners = self.fresh(inst, inst.shape)
        carried = [leaf.value for leaf in _leaves(owners)]
        # An element the body returns unchanged is no loop value in StableHLO: the import's canonicalizer
        # removes it and the body reads the value it was initialised with (an implicit capture).
        # XLA's round-trip import then reads a captured value that has a sharding through a fully open
        # constraint of its own (`OpenWhileFreeVarsSharding`): inside the loop it may be sharded further.
        if isinstance(owners, list) and isinstance(init, list):
            opened: dict[int, Leaf] = {}
            for i in _pass_through_elements(body):
                if i < len(owners) and i < len(init):
                    captured = init[i]
                    if isinstance(captured, Leaf) and captured.value.sharding is not None:
                        if id(captured.value) not in opened:
                            opened[id(captured.value)] = Leaf(self._open_constraint(inst, captured.value))
                        captured = opened[id(captured.value)]
                    owners[i] = captured
        # Shardy visits the condition's region before the body's.
        mark = len(self.p.ops)
        self.computation(cond, {0: owners})
        returned = self.computation(body, {0: owners})
        kept = {id(leaf.value) for leaf in _leaves(owners)}
        self._mark_targets([v for v in carried if id(v) in kept], mark)
        self.edges(inst, owners, [init, returned], [owners, owners])
        return owners

    def _open_constraint(self, inst: Instruction, value: Value) -> Value:
        like = value.sharding
        assert like is not None and value.dims is not None
        opened = self.p.new_value(f"{value.name}.free_in.{inst.name}", value.array or ArrayShape("f32", value.dims))
        opened.instruction = value.instruction
        opened.sharding = TensorSharding(like.mesh, tuple(DimSharding((), is_open=True) for _ in like.dims))
        self.add_op(Op(CONSTRAINT, opened.name, _op_name(inst), [value], [opened]))
        return opened

    def conditional(self, inst: Instruction, operands: list[Tree]) -> Tree:
        owners = self.fresh(inst, inst.shape)
        branches = inst.called_computations
        returned = [
            self.computation(self.module.computation(name), {0: operands[1 + i]}) for i, name in enumerate(branches)
        ]
        self.edges(inst, owners, returned, [])
        return owners

    def named_computation(self, inst: Instruction, operands: list[Tree]) -> Tree:
        """`sdy.named_computation`: the callee's parameters are block arguments, each the owner of an edge from
        its operand (sharded as the callee's parameter says: `in_shardings`), and the call's results are owners
        of edges from what the callee returns (sharded as the call says: `out_shardings`)."""
        callee = self.module.computation(inst.called_computations[0])
        if self.shared is not None and callee.name in self.shared:
            return self.shared_call(inst, operands, self.shared[callee.name])
        args: dict[int, Tree] = {}
        for param in callee.parameters:
            assert param.parameter_number is not None
            args[param.parameter_number] = self.fresh(param, param.shape)
        by_number = {param.parameter_number: param for param in callee.parameters}
        in_shardings: list[TensorSharding | None] = []
        for number in sorted(args):
            written = _sdy_shardings(by_number[number]) or ()
            in_shardings.extend(written[k] if k < len(written) else None for k in range(len(_leaves(args[number]))))
        block_args = [args[number] for number in sorted(args)]
        self.edges(inst, block_args, [operands], [], tuple(in_shardings))  # type: ignore[arg-type]
        returned = self.computation(callee, args)
        results = self.fresh(inst, inst.shape)
        self.edges(inst, results, [returned], [])
        self.p.named[_op_name(inst)] = (
            [leaf.value for arg in block_args for leaf in _leaves(arg)],
            [leaf.value for leaf in _leaves(results)],
        )
        self.p.named_written[_op_name(inst)] = (tuple(in_shardings), tuple(_sdy_shardings(inst) or ()))
        if self.shared is not None:
            arg_edges = [v.defining for arg in block_args for v in (leaf.value for leaf in _leaves(arg))]
            self.shared[callee.name] = SharedCallee(block_args, returned, arg_edges)
        return results

    def shared_call(self, inst: Instruction, operands: list[Tree], callee: SharedCallee) -> Tree:
        """Another call of a function whose body is built once: each of its operands is one more source of
        the edge on the callee's argument, and its results own edges from what the callee returns."""
        flat = [leaf.value for t in operands for leaf in _leaves(t)]
        for edge, operand in zip(callee.arg_edges, flat, strict=True):
            if edge is not None and edge.kind == EDGE:
                edge.operands.append(operand)
                operand.uses.append(edge)
        results = self.fresh(inst, inst.shape)
        self.edges(inst, results, [callee.returned], [])
        self.p.named[_op_name(inst)] = (
            [leaf.value for arg in callee.args for leaf in _leaves(arg)],
            [leaf.value for leaf in _leaves(results)],
        )
        return results

    def enter_manual(self, inst: Instruction, operands: list[Tree]) -> Tree:
        attrs = _frontend(inst)
        manual_axes = (attrs.sdy_manual_axes if attrs else None) or ()
        written = attrs.sdy_in_shardings if attrs else None
        in_shardings = list(written or ())
        if written is None and inst.sharding is not None:
            # libtpu 0.0.52's dumps: the shardings written natively, no attributes (`manual_hlo`).
            assert self.current is not None
            manual_axes = manual_axes_of(inst)
            in_shardings = in_shardings_of(inst, [self.current[name] for name in inst.operands])
        outer = [leaf.value for t in operands for leaf in _leaves(t)]
        arguments = self.fresh(inst, inst.shape)
        arg_values = [leaf.value for leaf in _leaves(arguments)]
        if len(in_shardings) != len(arg_values) or len(outer) != len(arg_values):
            raise UnsupportedHlo(f"{inst.name}: {len(in_shardings)} in_shardings for {len(arg_values)} operands")
        manual = ManualComputation(_op_name(inst), manual_axes, in_shardings, arguments=arg_values)
        self.p.manual.append(manual)
        self.manual_stack.append(manual)
        for j, (source, arg) in enumerate(zip(outer, arg_values, strict=True)):
            arg.sharding = erase_manual_axes(in_shardings[j], manual_axes)

            def before(s: TensorSharding | None, j: int = j) -> TensorSharding | None:
                return add_free_axes(manual.in_shardings[j], s, manual_axes) if s is not None else None

            self.add_op(
                Op(
                    EDGE,
                    f"{inst.name}#arg{j}",
                    manual.loc,
                    [source],
                    [arg],
                    inst=inst,
                    before=before,
                    after=lambda s: erase_manual_axes(s, manual_axes),
                )
            )
        return arguments

    def _body_call(self, inst: Instruction) -> Instruction:
        """The shard_map body's call whose results `inst` (a LocalToGlobalShape) returns."""
        assert self.current is not None
        source = self.current[inst.operands[0]]
        while source.opcode == "get-tuple-element":
            source = self.current[source.operands[0]]
        return source

    def _returns_inputless_body(self, inst: Instruction) -> bool:
        """Whether `inst` (a LocalToGlobalShape) returns the results of a shard_map body called with no operands."""
        comp = self.current
        if comp is None:
            return False
        for name in inst.operands:
            source = comp[name]
            while source.opcode == "get-tuple-element":
                source = comp[source.operands[0]]
            if _is_manual_body_call(source) and not source.operands:
                return True
        return False

    def leave_manual(self, inst: Instruction, operands: list[Tree]) -> Tree:
        attrs = _frontend(inst)
        if self._returns_inputless_body(inst):
            # A shard_map with no operands: JAX writes its body's call with no GlobalToLocalShape before it,
            # and the manual axes on this end alone.
            manual_axes = (attrs.sdy_manual_axes if attrs else None) or ()
            if not manual_axes and attrs is None and self.current is not None:
                manual_axes = manual_axes_of(self._body_call(inst))
            manual = ManualComputation(_op_name(inst), manual_axes, [])
            self.p.manual.append(manual)
        elif not self.manual_stack:
            raise UnsupportedHlo(f"{inst.name}: xla.sdy.LocalToGlobalShape without its GlobalToLocalShape")
        else:
            manual = self.manual_stack.pop()
        written_out = attrs.sdy_out_shardings if attrs else None
        manual.out_shardings = list(written_out or ())
        if written_out is None and inst.sharding is not None:
            manual.out_shardings = out_shardings_of(inst)
        returned = [leaf.value for t in operands for leaf in _leaves(t)]
        results = self.fresh(inst, inst.shape)
        result_values = [leaf.value for leaf in _leaves(results)]
        if len(manual.out_shardings) != len(result_values):
            raise UnsupportedHlo(
                f"{inst.name}: {len(manual.out_shardings)} out_shardings for {len(result_values)} results"
            )
        manual.results = result_values
        axes = manual.manual_axes
        for k, (source, result) in enumerate(zip(returned, result_values, strict=True)):
            result.sharding = manual.out_shardings[k]

            # The manual axes come back from the op's `out_shardings`, not from what the edge holds
            # (`ManualComputationOp::transformTargetSharding`, kAfterEdgePropagation).
            def after(s: TensorSharding, k: int = k) -> TensorSharding:
                return add_free_axes(manual.out_shardings[k], s, axes)

            self.add_op(
                Op(
                    EDGE,
                    f"{inst.name}#result{k}",
                    manual.loc,
                    [source],
                    [result],
                    inst=inst,
                    before=lambda s: erase_manual_axes(s, axes) if s is not None else None,
                    after=after,
                )
            )
        return results

    def _mark_targets(self, values: list[Value], since: int) -> None:
        """Uses inside a loop of its own carried values are uses of block arguments (edge targets)."""
        carried = {id(v) for v in values}
        for op in self.p.ops[since:]:
            for value in op.operands:
                if id(value) in carried and op in value.uses:
                    value.uses.remove(op)
                    value.target_uses.append(op)


def _is_manual_body_call(inst: Instruction) -> bool:
    return inst.opcode == "call" and inst.called_computations[0].startswith(MANUAL_BODY_PREFIX)


def is_named_computation(inst: Instruction) -> bool:
    """A call XLA's call inliner keeps (`planner.hlo.structure.inline.inlineable`) that is no shard_map body:
    Shardy imports a call that reaches it as an `sdy.named_computation` (`ImportFuncCallsPass`), the form
    `sdy-export-named-computations` writes back. Any other call is walked as if inlined; a shard_map body
    between its round-trip custom calls (`enter_manual`, `leave_manual`)."""
    return not inlineable(inst) and not _is_manual_body_call(inst)


def build_program(
    module: HloModule,
    meshes: dict[str, SdyMesh],
    order_key: OrderKey | None = None,
    keep_dead: bool = False,
    dedup_functions: bool = False,
    release: ShardyRelease | None = None,
) -> Program:
    """The Shardy view of `module`'s entry computation, calls and loops included.

    `order_key`: order each computation's ops by it (kept topological), for a module converted from MLIR
    whose instruction ids still say the MLIR module's own order. `keep_dead`: Shardy runs
    without its import, whose canonicalizer would erase dead ops (see `_live`). `dedup_functions`: every
    call of a function shares its one body (`SharedCallee`), as `sdy-propagation-pipeline{dedup-functions-
    fully=true}` keeps the call graph; otherwise each call has a body of its own (`sdy-flatten-call-graph`).
    `release`: whose Shardy's rules the ops follow (default: the installed jaxlib's, else the newest).
    """
    program = Program(meshes, release or ShardyRelease.installed(), module)
    builder = _Builder(module, program, order_key, keep_dead)
    if dedup_functions:
        builder.shared = {}
    entry = module.entry
    params: dict[int, Tree] = {}
    for inst in entry.parameters:
        assert inst.parameter_number is not None
        tree = builder.fresh(inst, inst.shape)
        shardings = _sdy_shardings(inst)
        for leaf, sharding in zip(_leaves(tree), shardings or (), strict=False):
            leaf.value.sharding = sharding
        params[inst.parameter_number] = tree
    for number in sorted(params):
        program.args.extend(leaf.value for leaf in _leaves(params[number]))
    root = builder.computation(entry, params)
    # XLA's own dump writes the function's result shardings natively on the root (where JAX's text has
    # `xla.sdy.FuncResultSharding` calls).
    on_root = named_shardings(entry.root)
    leaves = _leaves(root)
    for k, leaf in enumerate(leaves):
        result_sharding = leaf.func_result
        written = on_root[k] if len(on_root) == len(leaves) else None
        if result_sharding is None and written is not None:
            result_sharding = written.sharding
        program.results.append(FuncResult(leaf.value, result_sharding))
        leaf.value.extra_uses += 1
    return program

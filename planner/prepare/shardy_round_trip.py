"""The While loops as XLA's `shardy-xla` pass leaves them: its HLO -> StableHLO -> HLO round trip.

`shardy-xla` (xla/service/spmd/shardy/shardy_xla_pass.cc) converts the module to StableHLO, runs
Shardy's import, propagation and export there, and converts back. Three steps of that trip change
what every While carries, and so the loops the partitioner works on:

1. Pass-through elements become implicit captures. `WhileOpImplicitCapture` (run to a fixed point
   by `stablehlo_canonicalize_from_hlo_import.cc`, xla/mlir_hlo/stablehlo_ext/transforms) drops
   element i when the body returns, at position i, its own block argument i or the very value the
   loop starts element i with; so an element returning a dropped twin's argument, with the same
   starting value, goes on the next round. The condition, the body and the readers of result i
   after the loop read that starting value instead. The counter, updated carries and elements
   returned at another position stay, in their order. Only what reads a dropped element makes a
   capture (a kept element returning its value too); a dropped element nothing reads is gone.
2. Constant expressions are copied per reader (Shardy's `ConstantOrScalarSplitter`,
   shardy/dialect/sdy/transforms/import/constant_or_scalar_splitter.cc): each op that is not itself
   a constant expression gets its own copy, beside the original, of every non-scalar expression
   it reads that is built from constants and iotas through broadcasts, reshapes, slices and
   elementwise ops (not through a sharding constraint), and of every broadcast of a scalar. A
   RoPE table the body reads twice is two values; a mask the body reads once is one. Shardy's
   export (`ConstantOrScalarMerger`) folds copies of one broadcast of a scalar back together when
   their attributes, sharding included, are equal.
3. The exporter re-adds the captures as elements (`ExportXlaOp(WhileOp)`,
   xla/hlo/translate/mhlo_to_hlo/mlir_hlo_to_hlo.cc): `getUsedValuesDefinedAbove` over the
   condition, then the body, each walked in post-order (a nested loop's regions before its own
   operands; ops in `MakeInstructionPostOrder`, the order the importer reads HLO in), lists each
   captured value once, at its first read. They follow the kept elements and the body passes them
   through. A captured constant is copied into the loop instead (measured: a scalar constant the
   exported MLIR captures is no element of the HLO).

Worked example (XLA:TPU, Llama step, measured): the forward scan carries 40 elements: the counter,
27 updated carries, then 9 weights, `cos`, `sin` and a mask passed through. After the trip it
carries 46: the 28 kept ones, then the weights, four copies of `cos` and four of `sin` (the body
reshapes each once and four ops read the reshape) and the mask, in the order the body first reads
them. A splat constant of 32 elements or more would be captured as a broadcast (Shardy's import
rewrites it so first, `StablehloPrepareForHloExportPass`); no step measured has one.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

from planner.errors import UnsupportedHlo
from planner.hlo.ir.frontend_attributes import FrontendAttributes
from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape, Shape, TupleShape
from planner.hlo.ir.shardy_op_kinds import CONSTANT_PRESERVING
from planner.prepare.dead_code import remove_dead_code
from planner.prepare.edit import (
    ComputationEdit,
    ModuleEdit,
    get_tuple_element,
    has_side_effect,
    tuple_of,
    with_attribute,
)
from planner.prepare.rewrite import Rewrite

# StableHLO's prepare-for-export rewrites a splat constant of this many elements or more as a
# broadcast of a scalar (`prepareConstantOp`).
_SPLAT_MIN_ELEMENTS = 32
_LITERAL_TOKEN = re.compile(r"-?(?:inf|nan|true|false|[0-9.]+(?:e[-+]?[0-9]+)?)", re.IGNORECASE)
_GLOBAL_TO_LOCAL = "xla.sdy.GlobalToLocalShape"
_RETURN = ""  # the holder of a computation's result when its root is not a tuple


@dataclass(frozen=True)
class _Val:
    """A value as StableHLO has it: instruction `name`, element `index` of a tuple-shaped one (a
    While's result, a loop's parameter), or the splitter's copy number `clone` of a constant."""

    comp: str
    name: str
    index: int | None = None
    clone: int | None = None

    @property
    def original(self) -> _Val:
        return dataclasses.replace(self, clone=None)


@dataclass(frozen=True)
class _TupleRef:
    """A `tuple` instruction: StableHLO has none, its readers read its operands."""

    comp: str
    name: str


# A read: operand `slot` of instruction `holder` of computation `comp` (`_RETURN`: the root itself).
_Use = tuple[str, str, int]


@dataclass
class _Loop:
    comp: str
    name: str
    init: str
    cond: str
    body: str
    arity: int
    dropped: set[int] = field(default_factory=set)
    captures: list[_Val] = field(default_factory=list)

    @property
    def kept(self) -> list[int]:
        return [i for i in range(self.arity) if i not in self.dropped]


@dataclass(frozen=True)
class ShardyRoundTrip:
    NAME: ClassVar[str] = "shardy-xla"
    MIRRORS: ClassVar[str] = (
        "xla/service/spmd/shardy/shardy_xla_pass.cc: WhileOpImplicitCapture "
        "(stablehlo_canonicalize_from_hlo_import.cc), constant_or_scalar_splitter.cc and _merger.cc, "
        "ExportXlaOp(WhileOp) (mlir_hlo_to_hlo.cc)"
    )

    # Copies of one broadcast of a scalar are merged when propagation gives them one sharding. The
    # pass runs before propagation and takes them to (as on every step measured); off, each reader
    # keeps its copy (a loop whose two readers want different shardings, measured too).
    merge_broadcasts: bool = True

    def run(self, module: HloModule) -> Rewrite:
        if not any(i.opcode == "while" for c in module.computations for i in c):
            return Rewrite(module)
        trip = _Analysis(_normalized(module), self.merge_broadcasts)
        if not any(loop.dropped or loop.captures for loop in trip.loops.values()):
            return Rewrite(module)
        return _Rebuild(trip).run()


def _normalized(module: HloModule) -> HloModule:
    """Every While starts from a `tuple` of its own and its body returns a `tuple`, the form XLA's
    exporter writes: elements are then operands to drop and append."""
    edit = ModuleEdit(module)
    for comp in list(edit.computations.values()):
        for inst in list(comp):
            if inst.opcode != "while":
                continue
            cond, body = edit[inst.attr("condition").names[0]], edit[inst.attr("body").names[0]]
            tuples = (inst, comp[inst.operands[0]], cond.parameters[0], body.parameters[0], body.root)
            if any(_sharded(t) for t in tuples):
                raise UnsupportedHlo(f"{inst.name} or its tuples carry a sharding before propagation")
            init = comp[inst.operands[0]]
            if init.opcode != "tuple" or len(comp.users(init.name)) > 1:
                comp.set_operands(inst.name, (_as_tuple(edit, comp, init, before=inst.name),))
            if body.root.opcode != "tuple":
                body.root_name = _as_tuple(edit, body, body.root, before=None)
    return edit.freeze()


def _sharded(inst: Instruction) -> bool:
    """A sharding written on it, in HLO's spelling or Shardy's (the element list would no longer fit)."""
    attributes = inst.attr("frontend_attributes")
    shardy = isinstance(attributes, FrontendAttributes) and attributes.get("xla.sdy.sharding") is not None
    return inst.sharding is not None or shardy


def _as_tuple(edit: ModuleEdit, comp: ComputationEdit, value: Instruction, before: str | None) -> str:
    shape = value.shape
    assert isinstance(shape, TupleShape)
    parts = []
    for k in range(len(shape.elements)):
        if value.opcode == "tuple":
            parts.append(value.operands[k])
            continue
        gte = get_tuple_element(edit.fresh_name("get-tuple-element"), value.name, shape, k)
        parts.append(comp.add(gte, before=before).name)
    return comp.add(tuple_of(edit.fresh_name("tuple"), tuple(parts), shape.elements), before=before).name


def _same_type(a: Shape, b: Shape) -> bool:
    return isinstance(a, ArrayShape) and isinstance(b, ArrayShape) and a.to_text(False) == b.to_text(False)


def _rank(shape: Shape) -> int:
    return shape.rank if isinstance(shape, ArrayShape) else -1


def _is_big_splat(inst: Instruction) -> bool:
    shape, literal = inst.shape, inst.literal or ""
    if not isinstance(shape, ArrayShape) or shape.num_elements < _SPLAT_MIN_ELEMENTS or "..." in literal:
        return False
    return len(set(_LITERAL_TOKEN.findall(literal))) == 1


class _Analysis:
    """Which elements each loop keeps and which values it captures, in order (steps 1-3 above)."""

    def __init__(self, module: HloModule, merge_broadcasts: bool) -> None:
        self.module = module
        self.merge_broadcasts = merge_broadcasts
        self.loops: dict[tuple[str, str], _Loop] = {}
        self.loop_of: dict[str, _Loop] = {}  # a loop's condition and body -> the loop
        for comp in module.computations:
            for inst in comp:
                if inst.opcode == "while":
                    shape = inst.shape
                    assert isinstance(shape, TupleShape)
                    cond, body = inst.attr("condition").names[0], inst.attr("body").names[0]
                    loop = _Loop(comp.name, inst.name, inst.operands[0], cond, body, len(shape.elements))
                    self.loops[(comp.name, inst.name)] = loop
                    for region in (cond, body):
                        if region in self.loop_of:
                            raise UnsupportedHlo(f"{region} is the condition or body of more than one While")
                        self.loop_of[region] = loop
        self._orders: dict[str, list[Instruction]] = {}
        self.roots = self._roots()
        self.function = self._function_computations()
        self._memo: dict[tuple[str, str, int | None], _Val | _TupleRef] = {}
        self._drop_pass_through()
        self._const: dict[_Val, bool] = {}
        self._const_users: dict[_Val, list[_Val]] = {}
        self._survives: dict[_Val, bool] = {}
        self.copies: list[tuple[_Val, _Use, list[_Val]]] = []  # (root, the read it serves, nodes copied)
        self.copy_of_use: dict[_Use, int] = {}
        self.copies_at: dict[_Val, list[int]] = {}
        self._index_const_users()
        for root in self.roots:
            self._split(root)
        for loop in self.loops.values():
            inside = self._inside(loop)
            seen: dict[_Val, None] = {}
            for _, value in (*self.reads_after_split(loop.cond), *self.reads_after_split(loop.body)):
                if value.comp not in inside and not self.folded_constant(value):
                    seen.setdefault(value, None)
            loop.captures = list(seen)

    def inst(self, comp: str, name: str) -> Instruction:
        return self.module.computation(comp)[name]

    def shape(self, value: _Val) -> Shape:
        shape = self.inst(value.comp, value.name).shape
        return shape.elements[value.index] if isinstance(shape, TupleShape) and value.index is not None else shape

    def is_scalar(self, value: _Val) -> bool:
        return _rank(self.shape(value)) == 0

    # -- step 1: what each read reads once tuples are gone and pass-through elements captured -------

    def resolve(self, comp: str, name: str) -> _Val | _TupleRef:
        """The value `name` holds, seen through tuples, get-tuple-elements, no-op reshapes
        (`TupleIsUnpacked`, `ReshapeIsNoop`) and dropped elements."""
        key = (comp, name, None)
        if key not in self._memo:
            inst = self.inst(comp, name)
            if inst.opcode == "get-tuple-element":
                found = self.element(comp, inst.operands[0], inst.attr("index"))
            elif inst.opcode == "reshape" and _same_type(inst.shape, self.inst(comp, inst.operands[0]).shape):
                found = self.resolve(comp, inst.operands[0])
            elif inst.opcode == "tuple":
                found = _TupleRef(comp, name)
            else:
                found = _Val(comp, name)
            self._memo[key] = found
        return self._memo[key]

    def element(self, comp: str, name: str, k: int) -> _Val | _TupleRef:
        key = (comp, name, k)
        if key not in self._memo:
            holder = self.resolve(comp, name)
            if isinstance(holder, _TupleRef):
                found = self.resolve(holder.comp, self.inst(holder.comp, holder.name).operands[k])
            elif holder.index is not None:
                raise UnsupportedHlo(f"{name} in {comp} is a tuple inside a tuple")
            else:
                loop = self.loop_behind(holder)
                found = self.initial(loop, k) if loop and k in loop.dropped else _Val(holder.comp, holder.name, k)
            self._memo[key] = found
        return self._memo[key]

    def loop_behind(self, holder: _Val) -> _Loop | None:
        """The loop whose elements `holder` has: a While, or a loop's condition or body parameter."""
        opcode = self.inst(holder.comp, holder.name).opcode
        if opcode == "while":
            return self.loops[(holder.comp, holder.name)]
        return self.loop_of.get(holder.comp) if opcode == "parameter" else None

    def initial(self, loop: _Loop, k: int) -> _Val | _TupleRef:
        return self.element(loop.comp, loop.init, k)

    def _drop_pass_through(self) -> None:
        """`WhileOpImplicitCapture`, over every loop, to its fixed point."""
        changed = True
        while changed:
            changed = False
            for loop in self.loops.values():
                body = self.module.computation(loop.body)
                param = body.parameters[0].name
                for i in loop.kept:
                    returned = self.resolve(loop.body, body.root.operands[i])
                    if returned == _Val(loop.body, param, i) or returned == self.initial(loop, i):
                        loop.dropped.add(i)
                        self._memo.clear()
                        changed = True

    def target(self, use: _Use) -> _Val:
        comp, holder, slot = use
        read = self.module.computation(comp).root_name if holder == _RETURN else self.inst(comp, holder).operands[slot]
        value = self.resolve(comp, read)
        if isinstance(value, _TupleRef) or (value.index is None and self.loop_behind(value)):
            raise UnsupportedHlo(f"{holder or 'the root'} of {comp} reads the tuple {value.name} whole")
        return value

    # -- the ops of a computation, as the importer writes them -------------------------------------

    def ops(self, comp: str) -> Iterator[tuple[str, str, list[_Use]]]:
        """(kind, instruction, reads) of each op in import order: `while` (reads: the elements it
        keeps), `op`, then `return`."""
        computation = self.module.computation(comp)
        held: dict[str, list[tuple[str, str, list[_Use]]]] = {}
        for inst in self._post_order(computation):
            if inst.opcode in ("parameter", "get-tuple-element", "tuple"):
                continue
            if (shard_map := _shard_map_of(computation, inst)) is not None:
                held.setdefault(shard_map, []).append(("op", inst.name, self._reads(comp, inst)))
                continue
            yield from held.pop(inst.name, ())
            if inst.opcode == "reshape" and _same_type(inst.shape, computation[inst.operands[0]].shape):
                continue
            if inst.opcode == "while":
                yield "while", inst.name, [(comp, inst.operands[0], i) for i in self.loops[(comp, inst.name)].kept]
            else:
                yield "op", inst.name, self._reads(comp, inst)
        root = computation.root
        loop = self.loop_of.get(comp)
        if loop is not None and comp == loop.body:
            yield "return", root.name, [(comp, root.name, i) for i in loop.kept]
        elif root.opcode == "tuple":
            yield "return", root.name, self._reads(comp, root)
        else:
            yield "return", _RETURN, [(comp, _RETURN, 0)]

    def _reads(self, comp: str, inst: Instruction) -> list[_Use]:
        reads: list[_Use] = []
        for slot, operand in enumerate(inst.operands):
            value = self.resolve(comp, operand)
            if isinstance(value, _TupleRef):
                reads += self._reads(value.comp, self.inst(value.comp, value.name))
            else:
                reads.append((comp, inst.name, slot))
        return reads

    def _post_order(self, comp: Computation) -> list[Instruction]:
        """`MakeInstructionPostOrder`, the order the importer reads a computation in: depth first,
        operand 0 first, from each instruction nothing reads, in list order. Not the text's order:
        JAX prints its module in the order it built it, XLA's dumps in this one."""
        if comp.name not in self._orders:
            order: list[Instruction] = []
            visited: set[str] = set()
            for start in comp:
                if comp.users(start.name):
                    continue
                stack: list[tuple[str, bool]] = [(start.name, False)]
                while stack:
                    name, expanded = stack.pop()
                    if expanded:
                        order.append(comp[name])
                    elif name not in visited:
                        visited.add(name)
                        stack.append((name, True))
                        stack += [(o, False) for o in reversed(comp[name].operands) if o not in visited]
                        stack += [(o, False) for o in _control_predecessors(comp[name]) if o not in visited]
            self._orders[comp.name] = order
        return self._orders[comp.name]

    def _roots(self) -> list[str]:
        """The computations that hold loops but are no loop's: the entry, and a callee such as a
        shard_map body (a region nothing outside reaches into), each walked on its own."""
        module = self.module
        return [c.name for c in module.computations if c.name not in self.loop_of and (
            c.name == module.entry_name or any(i.opcode == "while" for i in c))]  # fmt: skip

    def _function_computations(self) -> list[str]:
        """The roots, then the computations of their loops, nested ones included."""
        found = list(self.roots)
        for comp in found:
            found += [c for i in self.module.computation(comp) if i.opcode == "while" for c in i.called_computations]
        return found

    def _inside(self, loop: _Loop) -> set[str]:
        inside: set[str] = set()
        stack = [loop.cond, loop.body]
        while stack:
            comp = stack.pop()
            if comp not in inside:
                inside.add(comp)
                stack += [c for i in self.module.computation(comp) for c in i.called_computations]
        return inside

    # -- step 2: the constant splitter -------------------------------------------------------------

    def is_const(self, value: _Val) -> bool:
        """`isConstantExpression`: a constant, an iota, or a constant-preserving op of them."""
        if value not in self._const:
            self._const[value] = False
            inst = self.inst(value.comp, value.name)
            if value.index is not None or not isinstance(inst.shape, ArrayShape) or has_side_effect(inst):
                pass
            elif inst.opcode in ("constant", "iota"):
                self._const[value] = True
            elif self._preserving(value.comp, inst):
                operands = [self.resolve(value.comp, o) for o in inst.operands]
                self._const[value] = all(isinstance(o, _Val) and self.is_const(o) for o in operands)
        return self._const[value]

    def _preserving(self, comp: str, inst: Instruction) -> bool:
        if inst.opcode == "bitcast-convert":
            return inst.array_shape.element_bits == self.inst(comp, inst.operands[0]).shape.leaves()[0].element_bits
        # A sharding annotation is not constant-preserving: it imports as `sdy.sharding_constraint`, which
        # `isElementwise` counts as elementwise but which is not `Pure` (ops.td gives it no memory-effect
        # trait), so the splitter's `isPure` check refuses it. A constraint on a constant is one value
        # however many ops read it (Gemma 2's splash-attention masks: three captured in XLA:TPU's forward
        # scan, not one copy per reader).
        return inst.opcode in CONSTANT_PRESERVING

    def is_expansion(self, value: _Val) -> bool:
        """`isScalarExpansion`: a broadcast of a scalar that is not a constant expression."""
        if value.index is not None or self.is_const(value):
            return False
        inst = self.inst(value.comp, value.name)
        return inst.opcode == "broadcast" and _rank(self.inst(value.comp, inst.operands[0]).shape) == 0

    def is_split(self, value: _Val) -> bool:
        """Read through copies: a constant expression or a broadcast of a scalar, not a scalar."""
        return not self.is_scalar(value) and (self.is_const(value) or self.is_expansion(value))

    def operand_values(self, value: _Val) -> list[_Val]:
        inst = self.inst(value.comp, value.name)
        return [o for o in (self.resolve(value.comp, name) for name in inst.operands) if isinstance(o, _Val)]

    def _index_const_users(self) -> None:
        for comp in self.function:
            for kind, name, _ in self.ops(comp):
                if kind == "op" and self.is_const(_Val(comp, name)):
                    for operand in self.operand_values(_Val(comp, name)):
                        self._const_users.setdefault(operand, []).append(_Val(comp, name))

    def survives(self, value: _Val) -> bool:
        """An original constant expression outlives the splitter when it is a scalar (never copied)
        or read by one that does; the others lose every reader to their copies and are erased."""
        if value not in self._survives:
            self._survives[value] = False
            users = self._const_users.get(value, [])
            self._survives[value] = self.is_scalar(value) or any(self.survives(u) for u in users)
        return self._survives[value]

    def erased(self, kind: str, value: _Val) -> bool:
        return kind == "op" and (self.is_const(value) or self.is_expansion(value)) and not self.survives(value)

    def _split(self, comp: str) -> None:
        """The splitter's pre-order walk: each op that is not a constant expression gets its own copy
        of what it reads through copies, nodes after their operands."""
        for kind, name, uses in self.ops(comp):
            value = _Val(comp, name)
            if kind != "op" or not (self.is_const(value) or self.is_expansion(value)):
                for use in uses:
                    root = self.target(use)
                    if self.is_split(root):
                        nodes: list[_Val] = []
                        self._nodes(root, nodes)
                        self.copy_of_use[use] = len(self.copies)
                        for node in nodes:
                            self.copies_at.setdefault(node, []).append(len(self.copies))
                        self.copies.append((root, use, nodes))
            if kind == "while":
                self._split(self.loops[(comp, name)].cond)
                self._split(self.loops[(comp, name)].body)

    def _nodes(self, value: _Val, nodes: list[_Val]) -> None:
        if self.is_scalar(value) or value in nodes or value.index is not None:
            return
        for operand in self.operand_values(value):
            self._nodes(operand, nodes)
        nodes.append(value)

    def copy_of(self, cid: int, node: _Val) -> _Val:
        """Copy `cid` of `node`, or, for a broadcast of a scalar with merging on, its first copy."""
        if self.merges(node):
            cid = self.copies_at[node][0]
        return dataclasses.replace(node, clone=cid)

    def merges(self, node: _Val) -> bool:
        inst = self.inst(node.comp, node.name)
        if not self.merge_broadcasts or node.index is not None:
            return False
        if inst.opcode == "constant":
            return _is_big_splat(inst)
        return inst.opcode == "broadcast" and _rank(self.inst(node.comp, inst.operands[0]).shape) == 0

    def copy_reads(self, cid: int, operand: _Val) -> _Val:
        """What copy `cid` of a node reads for `operand`: a scalar itself (never copied), else its copy."""
        return operand if self.is_scalar(operand) or operand.index is not None else self.copy_of(cid, operand)

    def split_target(self, use: _Use) -> _Val:
        cid = self.copy_of_use.get(use)
        return self.target(use) if cid is None else self.copy_of(cid, self.copies[cid][0])

    def folded_constant(self, value: _Val) -> bool:
        """A captured constant is copied into the loop, not carried (a big splat is a broadcast by then)."""
        inst = self.inst(value.comp, value.name)
        return value.index is None and inst.opcode == "constant" and not _is_big_splat(inst)

    # -- step 3: the exporter's walk -----------------------------------------------------------------

    def reads_after_split(self, comp: str) -> Iterator[tuple[object, _Val]]:
        """Every read in `comp` once the splitter has run, in `Region::walk`'s post-order."""
        for kind, name, uses in self.ops(comp):
            value = _Val(comp, name)
            if kind == "while":
                yield from self.reads_after_split(self.loops[(comp, name)].cond)
                yield from self.reads_after_split(self.loops[(comp, name)].body)
            if self.erased(kind, value):
                for cid in self.copies_at.get(value, []):  # the copies stand where the original did
                    if self.copy_of(cid, value).clone == cid:
                        for slot, operand in enumerate(self.operand_values(value)):
                            yield (cid, value, slot), self.copy_reads(cid, operand)
                continue
            for use in uses:
                yield use, self.split_target(use)

    def crosses(self, cid: int) -> bool:
        """Whether copy `cid` reads across a loop boundary: only those change what a loop carries."""
        root, use, nodes = self.copies[cid]
        if root.comp != use[0]:
            return True
        return any(self.copy_reads(cid, o).comp != node.comp for node in nodes for o in self.operand_values(node))


class _Rebuild:
    """The analysis written back as HLO: kept elements renumbered, captures appended and passed
    through, each read rewired to where its value now is, the splitter's copies made where they
    cross a loop (the others change no loop, and the module keeps one value for them)."""

    def __init__(self, trip: _Analysis) -> None:
        self.trip = trip
        self.edit = ModuleEdit(trip.module)
        self.capture_index: dict[tuple[str, _Val], int] = {}
        self.capture_gte: dict[tuple[str, int], str] = {}
        self.element_gte: dict[tuple[str, str, int], str] = {}
        self.constants: dict[tuple[str, _Val], str] = {}
        self.copy_names: dict[_Val, str] = {}
        self.made = {cid for cid in range(len(trip.copies)) if trip.crosses(cid)}
        self.first_gte: dict[tuple[str, str, int], str] = {}
        for comp in trip.module.computations:
            for inst in comp:
                if inst.opcode == "get-tuple-element":
                    self.first_gte.setdefault((comp.name, inst.operands[0], inst.attr("index")), inst.name)

    def run(self) -> Rewrite:
        trip = self.trip
        before = {c.name: [i.name for i in c] for c in trip.module.computations}
        summary = []
        for loop in trip.loops.values():
            for k, value in enumerate(loop.captures):
                for region in (loop.cond, loop.body):
                    self.capture_index[(region, value)] = len(loop.kept) + k
            if loop.dropped or loop.captures:
                arity = len(loop.kept) + len(loop.captures)
                summary.append(f"{loop.name}: {loop.arity} -> {arity} elements ({len(loop.dropped)} passed "
                               f"through dropped, {len(loop.captures)} captured)")  # fmt: skip
            self._reshape(loop)
        for cid in sorted(self.made):
            for node in trip.copies[cid][2]:
                self._copy(trip.copy_of(cid, node))
        for comp in trip.function:
            self._rewire(comp)
        remove_dead_code(self.edit)
        self._restore_names()
        return Rewrite(self.edit.freeze(), self._renamed(before), "; ".join(summary))

    def name_in(self, comp: str, value: _Val) -> str:
        """The name holding `value` in `comp`: its own there, else a capture's element (or a copy of a constant)."""
        if value.comp == comp:
            if value.clone is not None:
                return self._copy(value)
            return value.name if value.index is None else self._element(comp, value.name, value.index)
        if self.trip.folded_constant(value):
            return self._constant(comp, value)
        return self.capture_gte[(comp, self.capture_index[(comp, value)])]

    def _reshape(self, loop: _Loop) -> None:
        """The While, its init, parameters and body root take the new tuple; each capture gets its
        element read at the top of the condition and body."""
        parent = self.edit[loop.comp]
        old = parent[loop.name].shape
        assert isinstance(old, TupleShape)
        shape = TupleShape((*(old.elements[i] for i in loop.kept), *(self.trip.shape(v) for v in loop.captures)))
        parent.replace(dataclasses.replace(parent[loop.name], shape=shape))
        parent.replace(dataclasses.replace(parent[loop.init], shape=shape))
        for region in (loop.cond, loop.body):
            comp = self.edit[region]
            param = comp.parameters[0]
            comp.replace(dataclasses.replace(param, shape=shape))
            top = _after(comp, param.name)
            for k in range(len(loop.kept), len(shape.elements)):
                gte = get_tuple_element(self.edit.fresh_name("get-tuple-element"), param.name, shape, k)
                self.capture_gte[(region, k)] = comp.add(gte, before=top).name
        body = self.edit[loop.body]
        body.replace(dataclasses.replace(body.root, shape=shape))

    def _element(self, comp: str, holder: str, k: int) -> str:
        """A get-tuple-element reading element `k` of `holder` at its new index (the first one the
        module had, renumbered, or a new one)."""
        key = (comp, holder, k)
        if key not in self.element_gte:
            loop = self.trip.loop_behind(_Val(comp, holder))
            index = loop.kept.index(k) if loop is not None else k
            computation = self.edit[comp]
            name = self.first_gte.get(key)
            if name is not None:
                computation.replace(with_attribute(computation[name], "index", index, str(index)))
            else:
                shape = computation[holder].shape
                assert isinstance(shape, TupleShape)
                gte = get_tuple_element(self.edit.fresh_name("get-tuple-element"), holder, shape, index)
                name = computation.add(gte, before=_after(computation, holder)).name
            self.element_gte[key] = name
        return self.element_gte[key]

    def _constant(self, comp: str, value: _Val) -> str:
        key = (comp, value.original)
        if key not in self.constants:
            original = self.trip.inst(value.comp, value.name)
            computation = self.edit[comp]
            copy = dataclasses.replace(original, name=self.edit.fresh_name(original.name))
            self.constants[key] = computation.add(copy, before=_after(computation, computation.parameters[0].name)).name
        return self.constants[key]

    def _copy(self, value: _Val) -> str:
        """The splitter's copy `value.clone` of a constant-expression node, made beside the original."""
        if value not in self.copy_names:
            assert value.clone is not None
            node = value.original
            original = self.trip.inst(node.comp, node.name)
            operands = []
            for name in original.operands:
                read = self.trip.resolve(node.comp, name)
                assert isinstance(read, _Val)
                operands.append(self.name_in(node.comp, self.trip.copy_reads(value.clone, read)))
            copy = dataclasses.replace(original, name=self.edit.fresh_name(node.name), operands=tuple(operands))
            self.copy_names[value] = self.edit[node.comp].add(copy, before=node.name).name
        return self.copy_names[value]

    def _value_of(self, use: _Use) -> _Val:
        return self.trip.split_target(use) if self.trip.copy_of_use.get(use) in self.made else self.trip.target(use)

    def _rewire(self, comp: str) -> None:
        trip, computation = self.trip, self.edit[comp]
        for kind, name, uses in trip.ops(comp):
            if trip.erased(kind, _Val(comp, name)):
                continue  # its readers that cross a loop read copies; the others read only this computation
            reads = tuple(self.name_in(comp, self._value_of(use)) for use in uses)
            if kind == "while":
                loop = trip.loops[(comp, name)]
                computation.set_operands(loop.init, (*reads, *(self.name_in(comp, v) for v in loop.captures)))
            elif name == _RETURN:
                computation.root_name = reads[0]
            elif kind == "return" and comp in trip.loop_of and comp == trip.loop_of[comp].body:
                loop = trip.loop_of[comp]
                through = (self.capture_gte[(comp, len(loop.kept) + k)] for k in range(len(loop.captures)))
                computation.set_operands(name, (*reads, *through))
            else:
                for (_, holder, slot), read in zip(uses, reads):
                    operands = list(computation[holder].operands)
                    if operands[slot] != read:
                        operands[slot] = read
                        computation.set_operands(holder, tuple(operands))

    def _restore_names(self) -> None:
        """An original the splitter erased gives its name to its first copy."""
        for value, name in sorted(self.copy_names.items(), key=lambda kv: kv[0].clone or 0):
            comp = self.edit[value.comp]
            if value.name not in comp and name in comp:
                comp.add(dataclasses.replace(comp[name], name=value.name), before=name)
                comp.replace_uses(name, value.name)
                comp.remove(name)

    def _renamed(self, before: dict[str, list[str]]) -> dict[str, str]:
        """Each name that went -> the name now holding its value in its computation."""
        renamed: dict[str, str] = {}
        for comp_name, names in before.items():
            comp = self.edit.computations.get(comp_name)
            if comp is None:
                continue
            for name in names:
                value = self.trip.resolve(comp_name, name)
                holder = self._holder(comp_name, value) if isinstance(value, _Val) and name not in comp else None
                if holder is not None and holder != name and holder in comp:
                    renamed[name] = holder
        return renamed

    def _holder(self, comp: str, value: _Val) -> str | None:
        if value.comp == comp:
            return value.name if value.index is None else self.element_gte.get((comp, value.name, value.index))
        index = self.capture_index.get((comp, value))
        if index is not None:
            return self.capture_gte[(comp, index)]
        return self.constants.get((comp, value.original))


def _shard_map_of(comp: Computation, inst: Instruction) -> str | None:
    """The shard_map whose in-sharding `inst` holds, if it is one: libtpu 0.0.52 writes each operand's
    in-sharding as a side-effecting `Sharding` call read only by the shard_map's GlobalToLocalShape
    (`planner.propagation.shardy.manual_hlo`). The import builds `sdy.manual_computation` in place of
    the shard_map's body call (`ManualComputationPattern`, shard_map_import.cc) with the in-shardings
    as its own attribute, so the operand is read where the manual computation stands, not where the
    call holding its sharding was printed: the exporter captures a pass-through operand there
    (a Llama step's splash-attention masks after the layer's weights, as XLA:TPU's capture order)."""
    if inst.opcode != "custom-call" or inst.attr("custom_call_target") != "Sharding":
        return None
    if not inst.attr("custom_call_has_side_effect"):
        return None
    users = comp.users(inst.name)
    if len(users) != 1 or comp[users[0]].attr("custom_call_target") != _GLOBAL_TO_LOCAL:
        return None
    return users[0]


def _control_predecessors(inst: Instruction) -> list[str]:
    raw = inst.attr("control-predecessors")
    text = getattr(raw, "text", "") if raw is not None else ""
    return [n.strip().lstrip("%") for n in text.strip("{}").split(",") if n.strip()]


def _after(comp: ComputationEdit, name: str) -> str:
    """The instruction after `name` in program order (a new instruction goes before it)."""
    order = [i.name for i in comp]
    return order[order.index(name) + 1]

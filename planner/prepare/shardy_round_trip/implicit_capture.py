"""Step 1 of the round trip: the module as `shardy-xla`'s import reads it, pass-through loop elements
made implicit captures (`WhileOpImplicitCapture`, run to a fixed point by
`stablehlo_canonicalize_from_hlo_import.cc`, xla/mlir_hlo/stablehlo_ext/transforms).

StableHLO has no tuples: a read of a `get-tuple-element` of a `tuple` reads the tuple's operand, and a
no-op reshape is no op (`TupleIsUnpacked`, `ReshapeIsNoop`). A loop drops element i when its body
returns, at position i, its own block argument i or the very value the loop starts element i with; the
condition, the body and the readers of result i after the loop then read that starting value instead.
`ImportedModule` answers, for every read, which value it reads once that is done, and lists each
computation's ops in the order the importer writes them (`MakeInstructionPostOrder`).
"""

from __future__ import annotations

from collections.abc import Iterator

from planner.errors import UnsupportedHlo
from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.hlo.ir.shapes import Shape, TupleShape
from planner.prepare.shardy_round_trip.values import (
    RETURN,
    Loop,
    TupleRef,
    Use,
    Val,
    control_predecessors,
    rank,
    same_type,
    shard_map_of,
)


class ImportedModule:
    """The module's loops and reads as the import leaves them, pass-through elements dropped."""

    def __init__(self, module: HloModule) -> None:
        self.module = module
        self.loops: dict[tuple[str, str], Loop] = {}
        self.loop_of: dict[str, Loop] = {}  # a loop's condition and body -> the loop
        for comp in module.computations:
            for inst in comp:
                if inst.opcode == "while":
                    shape = inst.shape
                    assert isinstance(shape, TupleShape)
                    cond, body = inst.attr("condition").names[0], inst.attr("body").names[0]
                    loop = Loop(comp.name, inst.name, inst.operands[0], cond, body, len(shape.elements))
                    self.loops[(comp.name, inst.name)] = loop
                    for region in (cond, body):
                        if region in self.loop_of:
                            raise UnsupportedHlo(f"{region} is the condition or body of more than one While")
                        self.loop_of[region] = loop
        self._orders: dict[str, list[Instruction]] = {}
        self.roots = self._roots()
        self.function = self._function_computations()
        self._memo: dict[tuple[str, str, int | None], Val | TupleRef] = {}
        self._drop_pass_through()

    def inst(self, comp: str, name: str) -> Instruction:
        return self.module.computation(comp)[name]

    def shape(self, value: Val) -> Shape:
        shape = self.inst(value.comp, value.name).shape
        return shape.elements[value.index] if isinstance(shape, TupleShape) and value.index is not None else shape

    def is_scalar(self, value: Val) -> bool:
        return rank(self.shape(value)) == 0

    # -- what each read reads once tuples are gone and pass-through elements captured ----------------

    def resolve(self, comp: str, name: str) -> Val | TupleRef:
        """The value `name` holds, seen through tuples, get-tuple-elements, no-op reshapes
        (`TupleIsUnpacked`, `ReshapeIsNoop`) and dropped elements."""
        key = (comp, name, None)
        if key not in self._memo:
            inst = self.inst(comp, name)
            if inst.opcode == "get-tuple-element":
                found = self.element(comp, inst.operands[0], inst.attr("index"))
            elif inst.opcode == "reshape" and same_type(inst.shape, self.inst(comp, inst.operands[0]).shape):
                found = self.resolve(comp, inst.operands[0])
            elif inst.opcode == "tuple":
                found = TupleRef(comp, name)
            else:
                found = Val(comp, name)
            self._memo[key] = found
        return self._memo[key]

    def element(self, comp: str, name: str, k: int) -> Val | TupleRef:
        key = (comp, name, k)
        if key not in self._memo:
            holder = self.resolve(comp, name)
            if isinstance(holder, TupleRef):
                found = self.resolve(holder.comp, self.inst(holder.comp, holder.name).operands[k])
            elif holder.index is not None:
                raise UnsupportedHlo(f"{name} in {comp} is a tuple inside a tuple")
            else:
                loop = self.loop_behind(holder)
                found = self.initial(loop, k) if loop and k in loop.dropped else Val(holder.comp, holder.name, k)
            self._memo[key] = found
        return self._memo[key]

    def loop_behind(self, holder: Val) -> Loop | None:
        """The loop whose elements `holder` has: a While, or a loop's condition or body parameter."""
        opcode = self.inst(holder.comp, holder.name).opcode
        if opcode == "while":
            return self.loops[(holder.comp, holder.name)]
        return self.loop_of.get(holder.comp) if opcode == "parameter" else None

    def initial(self, loop: Loop, k: int) -> Val | TupleRef:
        return self.element(loop.comp, loop.init, k)

    def _drop_pass_through(self) -> None:
        """`WhileOpImplicitCapture`, over every loop, to its fixed point: an element returning a dropped
        twin's argument, with the same starting value, goes on the next round."""
        changed = True
        while changed:
            changed = False
            for loop in self.loops.values():
                body = self.module.computation(loop.body)
                param = body.parameters[0].name
                for i in loop.kept:
                    returned = self.resolve(loop.body, body.root.operands[i])
                    if returned == Val(loop.body, param, i) or returned == self.initial(loop, i):
                        loop.dropped.add(i)
                        self._memo.clear()
                        changed = True

    def target(self, use: Use) -> Val:
        comp, holder, slot = use
        read = self.module.computation(comp).root_name if holder == RETURN else self.inst(comp, holder).operands[slot]
        value = self.resolve(comp, read)
        if isinstance(value, TupleRef) or (value.index is None and self.loop_behind(value)):
            raise UnsupportedHlo(f"{holder or 'the root'} of {comp} reads the tuple {value.name} whole")
        return value

    def operand_values(self, value: Val) -> list[Val]:
        inst = self.inst(value.comp, value.name)
        return [o for o in (self.resolve(value.comp, name) for name in inst.operands) if isinstance(o, Val)]

    # -- the ops of a computation, as the importer writes them -------------------------------------

    def ops(self, comp: str) -> Iterator[tuple[str, str, list[Use]]]:
        """(kind, instruction, reads) of each op in import order: `while` (reads: the elements it
        keeps), `op`, then `return`."""
        computation = self.module.computation(comp)
        held: dict[str, list[tuple[str, str, list[Use]]]] = {}
        for inst in self._post_order(computation):
            if inst.opcode in ("parameter", "get-tuple-element", "tuple"):
                continue
            if (shard_map := shard_map_of(computation, inst)) is not None:
                held.setdefault(shard_map, []).append(("op", inst.name, self._reads(comp, inst)))
                continue
            yield from held.pop(inst.name, ())
            if inst.opcode == "reshape" and same_type(inst.shape, computation[inst.operands[0]].shape):
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
            yield "return", RETURN, [(comp, RETURN, 0)]

    def _reads(self, comp: str, inst: Instruction) -> list[Use]:
        reads: list[Use] = []
        for slot, operand in enumerate(inst.operands):
            value = self.resolve(comp, operand)
            if isinstance(value, TupleRef):
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
                        stack += [(o, False) for o in control_predecessors(comp[name]) if o not in visited]
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

    def inside(self, loop: Loop) -> set[str]:
        """The computations a loop's condition and body reach, its own included."""
        inside: set[str] = set()
        stack = [loop.cond, loop.body]
        while stack:
            comp = stack.pop()
            if comp not in inside:
                inside.add(comp)
                stack += [c for i in self.module.computation(comp) for c in i.called_computations]
        return inside

"""Step 3 of the round trip: the exporter re-adds each loop's captures as elements (`ExportXlaOp(WhileOp)`,
xla/hlo/translate/mhlo_to_hlo/mlir_hlo_to_hlo.cc), and the module is written back as HLO.

`getUsedValuesDefinedAbove` over the condition, then the body, each walked in post-order (a nested loop's
regions before its own operands; ops in `MakeInstructionPostOrder`, the order the importer reads HLO in),
lists each captured value once, at its first read. The captures follow the kept elements and the body
passes them through. A captured constant is copied into the loop instead (measured: a scalar constant
the exported MLIR captures is no element of the HLO).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from planner.hlo.ir.shapes import TupleShape
from planner.prepare.dead_code import remove_dead_code
from planner.prepare.edit import ComputationEdit, ModuleEdit, get_tuple_element, with_attribute
from planner.prepare.rewrite import Rewrite
from planner.prepare.shardy_round_trip.constant_splitter import ConstantSplit
from planner.prepare.shardy_round_trip.implicit_capture import ImportedModule
from planner.prepare.shardy_round_trip.values import RETURN, Loop, Use, Val, is_big_splat


def find_captures(imported: ImportedModule, split: ConstantSplit) -> None:
    """Each loop's captures, in the exporter's order: the values its condition and body read that are
    defined outside them, once each, at their first read after the splitter has run."""
    for loop in imported.loops.values():
        inside = imported.inside(loop)
        seen: dict[Val, None] = {}
        reads = (read for region in (loop.cond, loop.body) for read in _reads_after_split(imported, split, region))
        for _, value in reads:
            if value.comp not in inside and not folded_constant(imported, value):
                seen.setdefault(value, None)
        loop.captures = list(seen)


def folded_constant(imported: ImportedModule, value: Val) -> bool:
    """A captured constant is copied into the loop, not carried (a big splat is a broadcast by then)."""
    inst = imported.inst(value.comp, value.name)
    return value.index is None and inst.opcode == "constant" and not is_big_splat(inst)


def _reads_after_split(imported: ImportedModule, split: ConstantSplit, comp: str) -> Iterator[tuple[object, Val]]:
    """Every read in `comp` once the splitter has run, in `Region::walk`'s post-order."""
    for kind, name, uses in imported.ops(comp):
        value = Val(comp, name)
        if kind == "while":
            yield from _reads_after_split(imported, split, imported.loops[(comp, name)].cond)
            yield from _reads_after_split(imported, split, imported.loops[(comp, name)].body)
        if split.erased(kind, value):
            for cid in split.copies_at.get(value, []):  # the copies stand where the original did
                if split.copy_of(cid, value).clone == cid:
                    for slot, operand in enumerate(imported.operand_values(value)):
                        yield (cid, value, slot), split.copy_reads(cid, operand)
            continue
        for use in uses:
            yield use, split.split_target(use)


class Rebuild:
    """The analysis written back as HLO: kept elements renumbered, captures appended and passed
    through, each read rewired to where its value now is, the splitter's copies made where they
    cross a loop (the others change no loop, and the module keeps one value for them)."""

    def __init__(self, imported: ImportedModule, split: ConstantSplit) -> None:
        self.imported = imported
        self.split = split
        self.edit = ModuleEdit(imported.module)
        self.capture_index: dict[tuple[str, Val], int] = {}
        self.capture_gte: dict[tuple[str, int], str] = {}
        self.element_gte: dict[tuple[str, str, int], str] = {}
        self.constants: dict[tuple[str, Val], str] = {}
        self.copy_names: dict[Val, str] = {}
        self.made = {cid for cid in range(len(split.copies)) if split.crosses(cid)}
        self.first_gte: dict[tuple[str, str, int], str] = {}
        for comp in imported.module.computations:
            for inst in comp:
                if inst.opcode == "get-tuple-element":
                    self.first_gte.setdefault((comp.name, inst.operands[0], inst.attr("index")), inst.name)

    def run(self) -> Rewrite:
        imported, split = self.imported, self.split
        before = {c.name: [i.name for i in c] for c in imported.module.computations}
        summary = []
        for loop in imported.loops.values():
            for k, value in enumerate(loop.captures):
                for region in (loop.cond, loop.body):
                    self.capture_index[(region, value)] = len(loop.kept) + k
            if loop.dropped or loop.captures:
                arity = len(loop.kept) + len(loop.captures)
                summary.append(f"{loop.name}: {loop.arity} -> {arity} elements ({len(loop.dropped)} passed "
                               f"through dropped, {len(loop.captures)} captured)")  # fmt: skip
            self._reshape(loop)
        for cid in sorted(self.made):
            for node in split.copies[cid][2]:
                self._copy(split.copy_of(cid, node))
        for comp in imported.function:
            self._rewire(comp)
        remove_dead_code(self.edit)
        self._restore_names()
        return Rewrite(self.edit.freeze(), self._renamed(before), "; ".join(summary))

    def name_in(self, comp: str, value: Val) -> str:
        """The name holding `value` in `comp`: its own there, else a capture's element (or a copy of a constant)."""
        if value.comp == comp:
            if value.clone is not None:
                return self._copy(value)
            return value.name if value.index is None else self._element(comp, value.name, value.index)
        if folded_constant(self.imported, value):
            return self._constant(comp, value)
        return self.capture_gte[(comp, self.capture_index[(comp, value)])]

    def _reshape(self, loop: Loop) -> None:
        """The While, its init, parameters and body root take the new tuple; each capture gets its
        element read at the top of the condition and body."""
        parent = self.edit[loop.comp]
        old = parent[loop.name].shape
        assert isinstance(old, TupleShape)
        captured = (self.imported.shape(v) for v in loop.captures)
        shape = TupleShape((*(old.elements[i] for i in loop.kept), *captured))
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
            loop = self.imported.loop_behind(Val(comp, holder))
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

    def _constant(self, comp: str, value: Val) -> str:
        key = (comp, value.original)
        if key not in self.constants:
            original = self.imported.inst(value.comp, value.name)
            computation = self.edit[comp]
            copy = dataclasses.replace(original, name=self.edit.fresh_name(original.name))
            self.constants[key] = computation.add(copy, before=_after(computation, computation.parameters[0].name)).name
        return self.constants[key]

    def _copy(self, value: Val) -> str:
        """The splitter's copy `value.clone` of a constant-expression node, made beside the original."""
        if value not in self.copy_names:
            assert value.clone is not None
            node = value.original
            original = self.imported.inst(node.comp, node.name)
            operands = []
            for name in original.operands:
                read = self.imported.resolve(node.comp, name)
                assert isinstance(read, Val)
                operands.append(self.name_in(node.comp, self.split.copy_reads(value.clone, read)))
            copy = dataclasses.replace(original, name=self.edit.fresh_name(node.name), operands=tuple(operands))
            self.copy_names[value] = self.edit[node.comp].add(copy, before=node.name).name
        return self.copy_names[value]

    def _value_of(self, use: Use) -> Val:
        if self.split.copy_of_use.get(use) in self.made:
            return self.split.split_target(use)
        return self.imported.target(use)

    def _rewire(self, comp: str) -> None:
        imported, computation = self.imported, self.edit[comp]
        for kind, name, uses in imported.ops(comp):
            if self.split.erased(kind, Val(comp, name)):
                continue  # its readers that cross a loop read copies; the others read only this computation
            reads = tuple(self.name_in(comp, self._value_of(use)) for use in uses)
            if kind == "while":
                loop = imported.loops[(comp, name)]
                computation.set_operands(loop.init, (*reads, *(self.name_in(comp, v) for v in loop.captures)))
            elif name == RETURN:
                computation.root_name = reads[0]
            elif kind == "return" and comp in imported.loop_of and comp == imported.loop_of[comp].body:
                loop = imported.loop_of[comp]
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
                value = self.imported.resolve(comp_name, name)
                holder = self._holder(comp_name, value) if isinstance(value, Val) and name not in comp else None
                if holder is not None and holder != name and holder in comp:
                    renamed[name] = holder
        return renamed

    def _holder(self, comp: str, value: Val) -> str | None:
        if value.comp == comp:
            return value.name if value.index is None else self.element_gte.get((comp, value.name, value.index))
        index = self.capture_index.get((comp, value))
        if index is not None:
            return self.capture_gte[(comp, index)]
        return self.constants.get((comp, value.original))


def _after(comp: ComputationEdit, name: str) -> str:
    """The instruction after `name` in program order (a new instruction goes before it)."""
    order = [i.name for i in comp]
    return order[order.index(name) + 1]

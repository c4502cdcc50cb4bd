"""Step 2 of the round trip: Shardy's import copies constant expressions per reader, its export merges
some back (`ConstantOrScalarSplitter`, shardy/dialect/sdy/transforms/import/constant_or_scalar_splitter.cc;
`ConstantOrScalarMerger`, its export twin).

Each op that is not itself a constant expression gets its own copy, beside the original, of every
non-scalar expression it reads that is built from constants and iotas through broadcasts, reshapes,
slices and elementwise ops (not through a sharding constraint), and of every broadcast of a scalar. A
RoPE table the body reads twice is two values; a mask the body reads once is one. The merger folds
copies of one broadcast of a scalar back together when their attributes, sharding included, are equal.
"""

from __future__ import annotations

import dataclasses

from planner.hlo.ir.module import Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.hlo.ir.shardy_op_kinds import CONSTANT_PRESERVING
from planner.prepare.edit import has_side_effect
from planner.prepare.shardy_round_trip.implicit_capture import ImportedModule
from planner.prepare.shardy_round_trip.values import Use, Val, is_big_splat, rank


class ConstantSplit:
    """The splitter's copies over an imported module: which reads read a copy, and of what."""

    def __init__(self, imported: ImportedModule, merge_broadcasts: bool) -> None:
        self.imported = imported
        self.merge_broadcasts = merge_broadcasts
        self._const: dict[Val, bool] = {}
        self._const_users: dict[Val, list[Val]] = {}
        self._survives: dict[Val, bool] = {}
        self.copies: list[tuple[Val, Use, list[Val]]] = []  # (root, the read it serves, nodes copied)
        self.copy_of_use: dict[Use, int] = {}
        self.copies_at: dict[Val, list[int]] = {}
        self._index_const_users()
        for root in imported.roots:
            self._split(root)

    def is_const(self, value: Val) -> bool:
        """`isConstantExpression`: a constant, an iota, or a constant-preserving op of them."""
        if value not in self._const:
            self._const[value] = False
            inst = self.imported.inst(value.comp, value.name)
            if value.index is not None or not isinstance(inst.shape, ArrayShape) or has_side_effect(inst):
                pass
            elif inst.opcode in ("constant", "iota"):
                self._const[value] = True
            elif self._preserving(value.comp, inst):
                operands = [self.imported.resolve(value.comp, o) for o in inst.operands]
                self._const[value] = all(isinstance(o, Val) and self.is_const(o) for o in operands)
        return self._const[value]

    def _preserving(self, comp: str, inst: Instruction) -> bool:
        if inst.opcode == "bitcast-convert":
            operand = self.imported.inst(comp, inst.operands[0])
            return inst.array_shape.element_bits == operand.shape.leaves()[0].element_bits
        # A sharding annotation is not constant-preserving: it imports as `sdy.sharding_constraint`, which
        # `isElementwise` counts as elementwise but which is not `Pure` (ops.td gives it no memory-effect
        # trait), so the splitter's `isPure` check refuses it. A constraint on a constant is one value
        # however many ops read it (Gemma 2's splash-attention masks: three captured in XLA:TPU's forward
        # scan, not one copy per reader).
        return inst.opcode in CONSTANT_PRESERVING

    def is_expansion(self, value: Val) -> bool:
        """`isScalarExpansion`: a broadcast of a scalar that is not a constant expression."""
        if value.index is not None or self.is_const(value):
            return False
        inst = self.imported.inst(value.comp, value.name)
        return inst.opcode == "broadcast" and rank(self.imported.inst(value.comp, inst.operands[0]).shape) == 0

    def is_split(self, value: Val) -> bool:
        """Read through copies: a constant expression or a broadcast of a scalar, not a scalar."""
        return not self.imported.is_scalar(value) and (self.is_const(value) or self.is_expansion(value))

    def _index_const_users(self) -> None:
        imported = self.imported
        for comp in imported.function:
            for kind, name, _ in imported.ops(comp):
                if kind == "op" and self.is_const(Val(comp, name)):
                    for operand in imported.operand_values(Val(comp, name)):
                        self._const_users.setdefault(operand, []).append(Val(comp, name))

    def survives(self, value: Val) -> bool:
        """An original constant expression outlives the splitter when it is a scalar (never copied)
        or read by one that does; the others lose every reader to their copies and are erased."""
        if value not in self._survives:
            self._survives[value] = False
            users = self._const_users.get(value, [])
            self._survives[value] = self.imported.is_scalar(value) or any(self.survives(u) for u in users)
        return self._survives[value]

    def erased(self, kind: str, value: Val) -> bool:
        return kind == "op" and (self.is_const(value) or self.is_expansion(value)) and not self.survives(value)

    def _split(self, comp: str) -> None:
        """The splitter's pre-order walk: each op that is not a constant expression gets its own copy
        of what it reads through copies, nodes after their operands."""
        imported = self.imported
        for kind, name, uses in imported.ops(comp):
            value = Val(comp, name)
            if kind != "op" or not (self.is_const(value) or self.is_expansion(value)):
                for use in uses:
                    root = imported.target(use)
                    if self.is_split(root):
                        nodes: list[Val] = []
                        self._nodes(root, nodes)
                        self.copy_of_use[use] = len(self.copies)
                        for node in nodes:
                            self.copies_at.setdefault(node, []).append(len(self.copies))
                        self.copies.append((root, use, nodes))
            if kind == "while":
                self._split(imported.loops[(comp, name)].cond)
                self._split(imported.loops[(comp, name)].body)

    def _nodes(self, value: Val, nodes: list[Val]) -> None:
        if self.imported.is_scalar(value) or value in nodes or value.index is not None:
            return
        for operand in self.imported.operand_values(value):
            self._nodes(operand, nodes)
        nodes.append(value)

    def copy_of(self, cid: int, node: Val) -> Val:
        """Copy `cid` of `node`, or, for a broadcast of a scalar with merging on, its first copy."""
        if self.merges(node):
            cid = self.copies_at[node][0]
        return dataclasses.replace(node, clone=cid)

    def merges(self, node: Val) -> bool:
        """Whether the merger folds `node`'s copies together (`ConstantOrScalarMerger`)."""
        inst = self.imported.inst(node.comp, node.name)
        if not self.merge_broadcasts or node.index is not None:
            return False
        if inst.opcode == "constant":
            return is_big_splat(inst)
        return inst.opcode == "broadcast" and rank(self.imported.inst(node.comp, inst.operands[0]).shape) == 0

    def copy_reads(self, cid: int, operand: Val) -> Val:
        """What copy `cid` of a node reads for `operand`: a scalar itself (never copied), else its copy."""
        if self.imported.is_scalar(operand) or operand.index is not None:
            return operand
        return self.copy_of(cid, operand)

    def split_target(self, use: Use) -> Val:
        cid = self.copy_of_use.get(use)
        return self.imported.target(use) if cid is None else self.copy_of(cid, self.copies[cid][0])

    def crosses(self, cid: int) -> bool:
        """Whether copy `cid` reads across a loop boundary: only those change what a loop carries."""
        root, use, nodes = self.copies[cid]
        if root.comp != use[0]:
            return True
        return any(
            self.copy_reads(cid, o).comp != node.comp for node in nodes for o in self.imported.operand_values(node)
        )

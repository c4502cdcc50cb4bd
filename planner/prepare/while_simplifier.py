"""XLA's WhileLoopSimplifier (`simplify-while-loops`): the carried tuple loses what it need not carry.

For each While, the first of these that applies (one rewrite per loop per run, as XLA does; the
pipeline runs the pass again):
1. repeated elements: elements the body passes through unchanged (or updates with the very same
   dynamic-update-slice) whose initial value is the same instruction as an earlier element's are
   carried once;
2. dead elements: elements nothing after the loop reads, or that are passed through unchanged,
   which no other element, the condition or a side effect depends on;
3. constant elements: an element the init and the body's root both set to the same constant;
4. (then, without stopping) scalar constants carried unchanged are read as constants inside;
5. a loop that runs 0 times is its init; one that runs once is its body, inlined.
Not modelled: flattening nested tuples (JAX and torch_xla carry flat tuples), induction-variable
merging (a scan has one counter) and the trivial-compare option (off by default).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from planner.hlo.ir.module import HloModule, Instruction
from planner.hlo.structure.loops import trip_count
from planner.prepare.dead_code import remove_dead_code
from planner.prepare.edit import ComputationEdit, ModuleEdit, get_tuple_element, has_side_effect
from planner.prepare.rewrite import Rewrite
from planner.prepare.while_state import LoopView, parameter, remove_elements, whiles


@dataclass(frozen=True)
class WhileLoopSimplifier:
    NAME: ClassVar[str] = "simplify-while-loops"
    MIRRORS: ClassVar[str] = "xla/service/while_loop_simplifier.cc"

    def run(self, module: HloModule) -> Rewrite:
        edit = ModuleEdit(module)
        done = simplify_loops(edit)
        if not done:
            return Rewrite(module)
        return Rewrite(edit.freeze(), summary="; ".join(done))


def simplify_loops(edit: ModuleEdit) -> list[str]:
    """One rewrite per While where one applies, then dead code; returns what was done, per loop."""
    done: list[str] = []
    for loop in whiles(edit):
        if loop.name not in loop.parent:
            continue
        for rewrite in (repeated_elements, dead_elements, constant_elements):
            what = rewrite(loop)
            if what:
                done.append(f"{loop.name}: {what}")
                break
        else:
            what = propagate_scalar_constants(loop)
            if what:
                done.append(f"{loop.name}: {what}")
            what = remove_trivial_loop(loop)
            if what:
                done.append(f"{loop.name}: {what}")
    if done:
        remove_dead_code(edit)
    return done


def _shape_ok(loop: LoopView) -> bool:
    return loop.init.opcode == "tuple" and loop.body.root.opcode == "tuple"


def _is_dus_insertion(inst: Instruction, body: ComputationEdit) -> bool:
    if inst.opcode != "dynamic-update-slice":
        return False
    target = body[inst.operands[0]]
    return target.opcode == "get-tuple-element" and target.operands[0] == parameter(body).name


def repeated_elements(loop: LoopView) -> str | None:
    """`TryRemoveRepeatedWhileTupleIndices`: pivots in index order, duplicates of each removed."""
    removed = 0
    index = 0
    while index < len(loop.shape.elements):
        if not _shape_ok(loop):
            break
        body, init = loop.body, loop.init
        root, param = body.root, parameter(body).name
        pivot = body[root.operands[index]]
        if pivot.opcode == "get-tuple-element" and pivot.operands[0] == param:
            if pivot.attr("index") != index:
                index += 1
                continue
        elif _is_dus_insertion(pivot, body):
            if body[pivot.operands[0]].attr("index") != index:
                index += 1
                continue
        else:
            index += 1
            continue
        duplicates: list[int] = []
        final_as_pivot = False
        for i in range(index + 1, len(loop.shape.elements)):
            element = body[root.operands[i]]
            if pivot.opcode == "get-tuple-element":
                if not (element.opcode == "get-tuple-element" and element.operands[0] == param):
                    continue
                if element.attr("index") != i:
                    continue
            elif _is_dus_insertion(element, body):
                if len(element.operands) != len(pivot.operands) or body[element.operands[0]].attr("index") != i:
                    continue
                if element.operands[0] == pivot.operands[0] or element.operands[1:] != pivot.operands[1:]:
                    continue
                final_as_pivot = True
            else:
                continue
            if init.operands[i] == init.operands[index]:
                duplicates.append(i)
        if duplicates:
            for comp in (body, loop.condition):
                _read_pivot_instead(loop, comp, index, set(duplicates))
            keep = [i for i in range(len(loop.shape.elements)) if i not in duplicates]
            remove_elements(loop, keep, final_as=index if final_as_pivot else None)
            removed += len(duplicates)
        index += 1
    return f"{removed} repeated elements carried once" if removed else None


def _read_pivot_instead(loop: LoopView, comp: ComputationEdit, index: int, duplicates: set[int]) -> None:
    """Every read of a duplicate element reads the pivot's element instead (one new read of it)."""
    param = parameter(comp)
    reads = [u for u in comp.users(param.name) if u.opcode == "get-tuple-element" and u.attr("index") in duplicates]
    if not reads:
        return
    shape = param.shape
    assert not isinstance(shape, type(None))
    gte = get_tuple_element(loop.edit.fresh_name("get-tuple-element"), param.name, shape, index)  # type: ignore[arg-type]
    comp.add(gte, before=_first_after_parameters(comp))
    for read in reads:
        comp.replace_uses(read.name, gte.name)
        comp.remove(read.name)


def _first_after_parameters(comp: ComputationEdit) -> str:
    for inst in comp:
        if inst.opcode != "parameter":
            return inst.name
    return comp.root_name


def dead_elements(loop: LoopView) -> str | None:
    """`TryRemoveDeadWhileParams`, both of its cases (independent elements, and groups)."""
    if not _shape_ok(loop):
        return None
    body, condition, parent = loop.body, loop.condition, loop.parent
    arity = len(loop.shape.elements)
    if arity == 0:
        return None
    for comp in (body, condition):
        if any(u.opcode != "get-tuple-element" for u in comp.users(parameter(comp).name) if u.name != comp.root_name):
            return None
    root = body.root
    used_after: set[int] = set()
    users = parent.users(loop.name)
    if parent.root_name == loop.name or any(u.opcode != "get-tuple-element" for u in users):
        used_after = set(range(arity))
    else:
        used_after = {u.attr("index") for u in users}

    deps: dict[tuple[str, str], frozenset[int]] = {}
    union = _UnionFind()
    side_effecting: set[int] = set()
    for comp in (body, condition):
        param = parameter(comp).name
        for inst in comp:
            if inst.name == param or (comp is body and inst.name == root.name):
                continue
            key = (comp.name, inst.name)
            union.add(key)
            if inst.opcode == "get-tuple-element" and inst.operands[0] == param:
                k = inst.attr("index")
                deps[key] = frozenset({k})
                output = root.operands[k]
                if output != inst.name:
                    union.union((body.name, output), key)
            else:
                found: set[int] = set()
                for op in inst.operands:
                    union.union((comp.name, op), key)
                    found |= deps.get((comp.name, op), frozenset())
                deps[key] = frozenset(found)
            if has_side_effect(inst) or (comp is condition and inst.name == condition.root_name):
                side_effecting |= deps[key]
    affecting_others = {k for i in range(arity) for k in deps.get((body.name, root.operands[i]), ()) if k != i}
    removable = {
        i for i in range(arity) if i not in affecting_others and i not in used_after and i not in side_effecting
    }
    groups: dict[tuple[str, str], set[int]] = {}
    for i in range(arity):
        groups.setdefault(union.find((body.name, root.operands[i])), set()).add(i)
    for comp in (body, condition):
        for gte in comp.users(parameter(comp).name):
            if gte.opcode == "get-tuple-element":
                groups.setdefault(union.find((comp.name, gte.name)), set()).add(gte.attr("index"))
    param = parameter(body).name
    for members in groups.values():

        def blocks(i: int) -> bool:
            output = body[root.operands[i]]
            passes_through = output.opcode == "get-tuple-element" and output.operands[0] == param
            passes_through = passes_through and output.attr("index") == i
            return i in side_effecting or (i in used_after and not passes_through)

        if not any(blocks(i) for i in members):
            removable |= members
    if not removable:
        return None
    remove_elements(loop, [i for i in range(arity) if i not in removable])
    return f"{len(removable)} dead elements removed"


class _UnionFind:
    def __init__(self) -> None:
        self._parent: dict[tuple[str, str], tuple[str, str]] = {}

    def add(self, x: tuple[str, str]) -> None:
        self._parent.setdefault(x, x)

    def find(self, x: tuple[str, str]) -> tuple[str, str]:
        self.add(x)
        while self._parent[x] != x:
            self._parent[x] = self._parent[self._parent[x]]
            x = self._parent[x]
        return x

    def union(self, a: tuple[str, str], b: tuple[str, str]) -> None:
        self._parent[self.find(a)] = self.find(b)


def constant_elements(loop: LoopView) -> str | None:
    """`TryRemoveConstantParams`: an element set to the same constant by the init and the body."""
    if not _shape_ok(loop):
        return None
    body, parent, init = loop.body, loop.parent, loop.init
    root = body.root
    constant = []
    for i, (a, b) in enumerate(zip(init.operands, root.operands)):
        x, y = parent[a], body[b]
        if x.opcode == y.opcode == "constant" and x.literal_key == y.literal_key and _same_type(x, y):
            constant.append(i)
    if not constant or len(constant) == len(loop.shape.elements):
        return None
    for comp in (body, loop.condition):
        param = parameter(comp)
        for read in list(comp.users(param.name)):
            if read.opcode == "get-tuple-element" and read.attr("index") in constant:
                value = parent[init.operands[read.attr("index")]]
                copy = dataclasses.replace(value, name=loop.edit.fresh_name(value.name))
                comp.add(copy, before=read.name)
                comp.replace_uses(read.name, copy.name)
                comp.remove(read.name)
    _final_values_from_init(loop, constant)
    remove_elements(loop, [i for i in range(len(loop.shape.elements)) if i not in constant])
    return f"{len(constant)} constant elements removed"


def _same_type(a: Instruction, b: Instruction) -> bool:
    return a.shape.leaves()[0].element_type == b.shape.leaves()[0].element_type


def _final_values_from_init(loop: LoopView, indices: list[int]) -> None:
    """Reads of these elements after the loop read the init's (equal) constants."""
    parent, init = loop.parent, loop.init
    for user in parent.users(loop.name):
        if user.opcode == "get-tuple-element" and user.attr("index") in indices:
            parent.replace_uses(user.name, init.operands[user.attr("index")])
            parent.remove(user.name)


def propagate_scalar_constants(loop: LoopView) -> str | None:
    """`TryPropagateConstant`: a scalar constant carried unchanged is read as the constant inside."""
    if not _shape_ok(loop):
        return None
    body, parent, init = loop.body, loop.parent, loop.init
    root, param = body.root, parameter(body).name
    constants: dict[int, Instruction] = {}
    for i, name in enumerate(root.operands):
        element = body[name]
        value = parent[init.operands[i]]
        passes = element.opcode == "get-tuple-element" and element.operands[0] == param and element.attr("index") == i
        if passes and element.shape.leaves()[0].rank == 0 and value.opcode == "constant":
            constants[i] = value
    replaced = 0
    for comp in (loop.condition, body):
        for read in list(comp.users(parameter(comp).name)):
            if read.opcode != "get-tuple-element" or read.attr("index") not in constants:
                continue
            if not comp.has_users(read.name) and read.name != comp.root_name:
                continue
            value = constants[read.attr("index")]
            copy = dataclasses.replace(value, name=loop.edit.fresh_name(f"{value.name}.clone"))
            comp.add(copy, before=read.name)
            comp.replace_uses(read.name, copy.name)
            replaced += 1
    return f"{replaced} carried scalar constants read as constants" if replaced else None


def remove_trivial_loop(loop: LoopView, side_effect: Callable[[Instruction], bool] = has_side_effect) -> str | None:
    """`TryRemoveWhileLoop`: a loop that runs 0 times is its init; one that runs once, its body inlined. A
    loop whose body or condition holds a `side_effect` stays."""
    if any(side_effect(i) for c in (loop.body, loop.condition) for i in c):
        return None
    count = loop_trip_count(loop)
    if count == 0:
        loop.parent.replace_uses(loop.name, loop.init.name)
        loop.parent.remove(loop.name)
        return "runs 0 times: replaced by its init"
    if count == 1 and not _skips_trip_count_one(loop.instruction):
        _inline_body(loop)
        return "runs once: its body inlined"
    return None


def _skips_trip_count_one(inst: Instruction) -> bool:
    attrs = inst.attr("frontend_attributes")
    values = getattr(attrs, "values", None)
    return isinstance(values, dict) and values.get("skip-simplify-while-loops_trip-count-one") == "true"


def loop_trip_count(loop: LoopView) -> int | None:
    """The count the planner's loop analysis finds (`hlo.loops.trip_count`), on the loop's computations."""
    parent, body, condition = loop.parent.freeze(), loop.body.freeze(), loop.condition.freeze()
    around = HloModule(loop.edit.entry_name, (parent, body, condition), parent.name)
    return trip_count(around, parent, loop.instruction)[0]


def _inline_body(loop: LoopView) -> None:
    """The While becomes its body, run once on the init (XLA: a call to the body, then inlined)."""
    parent, body, edit = loop.parent, loop.body, loop.edit
    rename = {parameter(body).name: loop.init.name}
    for inst in body:
        if inst.opcode == "parameter":
            continue
        name = inst.name if inst.name not in parent else edit.fresh_name(inst.name)
        rename[inst.name] = name
        parent.add(dataclasses.replace(inst, name=name, operands=tuple(rename[o] for o in inst.operands)),
                   before=loop.name)  # fmt: skip
    parent.replace_uses(loop.name, rename[body.root_name])
    parent.remove(loop.name)

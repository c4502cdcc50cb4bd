"""The carried tuple of a While, edited: which elements are invariant, removing some, adding some.

The loop passes XLA:TPU runs before it partitions all work on this tuple (XLA's `WhileUtil` and
`while_loop_simplifier.cc`'s `RemoveDeadTupleIndices`). XLA builds a new While with new
computations for each change; here the While, its body and condition keep their names and change in
place, so every name a plan writes against the module before these passes still means the same
instruction after them. Worked example of removing element 1 of three:

    init  = (s32[], f32[8], f32[4]) tuple(i, c, x)        init'  = (s32[], f32[4]) tuple(i, x)
    body: p = param; a = gte(p), index=2 ...              body: p = param (2 elements); a = gte(p), index=1
    after: y = gte(w), index=1                            after: y reads c, the value element 1 kept
"""

from __future__ import annotations

import dataclasses

from planner.hlo.ir.module import Instruction
from planner.hlo.ir.shapes import TupleShape
from planner.prepare.edit import ComputationEdit, ModuleEdit, get_tuple_element, tuple_of


@dataclasses.dataclass(frozen=True)
class LoopView:
    """A While and the computations around it, in a `ModuleEdit`."""

    edit: ModuleEdit
    computation: str
    name: str

    @property
    def parent(self) -> ComputationEdit:
        return self.edit[self.computation]

    @property
    def instruction(self) -> Instruction:
        return self.parent[self.name]

    @property
    def body(self) -> ComputationEdit:
        return self.edit[self.instruction.attr("body").names[0]]

    @property
    def condition(self) -> ComputationEdit:
        return self.edit[self.instruction.attr("condition").names[0]]

    @property
    def init(self) -> Instruction:
        return self.parent[self.instruction.operands[0]]

    @property
    def shape(self) -> TupleShape:
        shape = self.instruction.shape
        assert isinstance(shape, TupleShape), f"{self.name} carries no tuple"
        return shape


def whiles(edit: ModuleEdit, order: list[str] | None = None) -> list[LoopView]:
    """Every While of the module, computation by computation in module order (or in `order`), each
    computation's in instruction order."""
    names = order if order is not None else list(edit.computations)
    return [LoopView(edit, n, i.name) for n in names for i in edit[n] if i.opcode == "while"]


def parameter(comp: ComputationEdit) -> Instruction:
    return comp.parameters[0]


def invariant_gtes(body: ComputationEdit) -> list[Instruction]:
    """Root operands that read their own index of the body's parameter: elements carried unchanged.

    XLA's `WhileUtil::GetInvariantGTEsForWhileBody`: root operand i is `get-tuple-element(param),
    index=i`.
    """
    root = body.root
    if root.opcode != "tuple" or not body.parameters:
        return []
    param = parameter(body).name
    found = []
    for i, name in enumerate(root.operands):
        inst = body[name]
        if inst.opcode == "get-tuple-element" and inst.attr("index") == i and inst.operands[0] == param:
            found.append(inst)
    return found


def gtes_by_index(comp: ComputationEdit) -> dict[int, list[Instruction]]:
    """The get-tuple-elements of the computation's parameter, by the index they read."""
    found: dict[int, list[Instruction]] = {}
    for user in comp.users(parameter(comp).name):
        if user.opcode == "get-tuple-element":
            found.setdefault(user.attr("index"), []).append(user)
    return found


def remove_elements(loop: LoopView, keep: list[int], final_as: int | None = None) -> None:
    """The While carries only elements `keep` (sorted); every read of a removed element after the
    loop reads the value the loop started with (callers remove only elements whose final value is
    their initial one, or that nothing after the loop reads), or, with `final_as`, the final value
    of that kept element (a repeated element updated exactly like it).

    Inside the body and condition, the removed elements' get-tuple-elements and everything computed
    from them go (the callers guarantee none of it reaches a kept element).
    """
    old = loop.shape
    new_index = {old_index: k for k, old_index in enumerate(keep)}
    shape = TupleShape(tuple(old.elements[i] for i in keep))
    body = loop.body
    root = body.root
    body.set_operands(root.name, tuple(root.operands[i] for i in keep))
    body.replace(dataclasses.replace(body[root.name], shape=shape))
    for comp in (body, loop.condition):
        stale = _narrow_parameter(comp, shape, new_index)
        comp.remove_dead()
        left = [n for n in stale if n in comp]
        assert not left, f"{left} in {comp.name} read removed elements of {loop.name} and are still used"
    _rebuilt(loop)

    parent, init, name = loop.parent, loop.init, loop.name
    # The value each removed element starts with, for what reads it after the loop.
    initial = {i: element_of(loop.edit, parent, init, old, i, before=name) for i in range(len(old.elements))
               if i not in new_index}  # fmt: skip
    if init.opcode == "tuple":
        new_init = tuple(init.operands[i] for i in keep)
        operands = new_init
    else:
        operands = tuple(element_of(loop.edit, parent, init, old, i, before=name) for i in keep)
    init_name = loop.edit.fresh_name("tuple")
    parent.add(tuple_of(init_name, operands, shape.elements), before=name)
    parent.replace(dataclasses.replace(loop.instruction, operands=(init_name,), shape=shape))
    whole: str | None = None
    for user in parent.users(name):
        if user.opcode != "get-tuple-element":
            # Read whole (a copy of the loop's result, a tuple, the root): as XLA's simplifier does, the old
            # result is rebuilt as a tuple of the new loop's elements and the removed ones' values.
            if whole is None:
                whole = _rebuilt_result(loop, old, new_index, shape, initial, final_as, before=user.name)
            parent.set_operands(user.name, tuple(whole if o == name else o for o in user.operands))
            continue
        index = user.attr("index")
        if index in new_index:
            parent.replace(_with_index(user, new_index[index]))
        elif final_as is not None:
            parent.replace(_with_index(user, new_index[final_as]))
        else:
            parent.replace_uses(user.name, initial[index])
            parent.remove(user.name)
    if parent.root_name == name:
        # The loop's result is the computation's: the rebuilt tuple takes its place, the module's shape kept.
        if whole is None:
            whole = _rebuilt_result(loop, old, new_index, shape, initial, final_as, before=name)
            order = [i.name for i in parent if i.name != name]
            order.insert(min(k for k, n in enumerate(order) if name in parent[n].operands), name)
            parent.reorder(order)
        parent.root_name = whole
    if init.opcode == "tuple" and not parent.has_users(init.name) and init.name != parent.root_name:
        parent.remove(init.name)


def append_elements(loop: LoopView, values: list[str]) -> list[str]:
    """The While carries `values` (names in its computation) as new last elements, unchanged by the
    body; returns the body's get-tuple-elements that read them (XLA's `MakeInstructionsLiveIn`)."""
    parent = loop.parent
    old = loop.shape
    added = tuple(parent[v].shape for v in values)
    shape = TupleShape((*old.elements, *added))
    init = loop.init
    if init.opcode == "tuple":
        operands = (*init.operands, *values)
    else:
        operands = (*(element_of(loop.edit, parent, init, old, i, before=loop.name) for i in range(len(old.elements))),
                    *values)  # fmt: skip
    init_name = loop.edit.fresh_name("tuple")
    parent.add(tuple_of(init_name, operands, shape.elements), before=loop.name)
    parent.replace(dataclasses.replace(loop.instruction, operands=(init_name,), shape=shape))
    if init.opcode == "tuple" and not parent.has_users(init.name):
        parent.remove(init.name)
    live_in = []
    for comp in (loop.body, loop.condition):
        param = parameter(comp)
        comp.replace(dataclasses.replace(param, shape=shape))
        for user in comp.users(param.name):
            if user.opcode == "get-tuple-element":
                continue
            raise AssertionError(f"{user.name} reads the parameter of {comp.name} whole")
    body = loop.body
    param_name = parameter(body).name
    root = body.root
    through = []
    for k in range(len(values)):
        index = len(old.elements) + k
        gte = get_tuple_element(loop.edit.fresh_name("get-tuple-element"), param_name, shape, index)
        body.add(gte, before=_after(body, param_name))
        live_in.append(gte.name)
        through.append(gte.name)
    body.set_operands(root.name, (*root.operands, *through))
    body.replace(dataclasses.replace(body[root.name], shape=shape))
    _rebuilt(loop)
    return live_in


def _rebuilt(loop: LoopView) -> None:
    """XLA makes a new While with a new condition and body (in that order) for every tuple change."""
    loop.edit.recreated(loop.condition.name)
    loop.edit.recreated(loop.body.name)


def _after(comp: ComputationEdit, name: str) -> str:
    """The instruction after `name` in program order (a new instruction goes before it)."""
    order = [i.name for i in comp]
    return order[order.index(name) + 1]


def _narrow_parameter(comp: ComputationEdit, shape: TupleShape, new_index: dict[int, int]) -> list[str]:
    """The parameter takes `shape`; its reads of kept elements are renumbered. Returns the reads of
    removed elements, which must be dead once the root no longer returns them."""
    param = parameter(comp)
    comp.replace(dataclasses.replace(param, shape=shape))
    stale = []
    for user in comp.users(param.name):
        if user.opcode != "get-tuple-element":
            raise AssertionError(f"{user.name} reads the parameter of {comp.name} whole")
        index = user.attr("index")
        if index in new_index:
            comp.replace(_with_index(user, new_index[index]))
        else:
            stale.append(user.name)
    return stale


def _rebuilt_result(loop: LoopView, old: TupleShape, new_index: dict[int, int], shape: TupleShape,
                    initial: dict[int, str], final_as: int | None, before: str) -> str:  # fmt: skip
    """A tuple of the loop's old shape, placed before `before` (the first reader of the whole result): kept
    elements read from the new loop, removed ones their initial value (or, with `final_as`, that kept
    element's final value)."""
    parent, name = loop.parent, loop.name
    elements = []
    for i in range(len(old.elements)):
        k = new_index.get(i, new_index[final_as] if final_as is not None else None)
        if k is None:
            elements.append(initial[i])
            continue
        gte = get_tuple_element(loop.edit.fresh_name("get-tuple-element"), name, shape, k)
        parent.add(gte, before=before)
        elements.append(gte.name)
    rebuilt = tuple_of(loop.edit.fresh_name("tuple"), tuple(elements), old.elements)
    parent.add(rebuilt, before=before)
    return rebuilt.name


def _with_index(gte: Instruction, index: int) -> Instruction:
    from planner.prepare.edit import with_attribute

    return with_attribute(gte, "index", index, str(index))


def element_of(edit: ModuleEdit, comp: ComputationEdit, tuple_inst: Instruction, shape: TupleShape, index: int,
                before: str) -> str:  # fmt: skip
    """A name holding element `index` of `tuple_inst`: its operand for a tuple op, else a new get-tuple-element."""
    if tuple_inst.opcode == "tuple":
        return tuple_inst.operands[index]
    gte = get_tuple_element(edit.fresh_name("get-tuple-element"), tuple_inst.name, shape, index)
    comp.add(gte, before=before)
    return gte.name

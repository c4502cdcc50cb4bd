"""`%t#k` operands: element k of the tuple-valued instruction t, as XLA's printer now writes them.

Newer XLA (the one jax 0.12 carries) prints no `get-tuple-element` line for a tuple element
that is read plainly: its users name the element in place. For example a While body

    %arg_tuple.1 = (s32[], f32[8,512]) parameter(0)
    %add.15 = s32[] add(%arg_tuple.1#0, %constant.39)

is the module older XLA printed as

    %arg_tuple.1 = (s32[], f32[8,512]) parameter(0)
    %get-tuple-element.1 = s32[] get-tuple-element(%arg_tuple.1), index=0
    %add.15 = s32[] add(%get-tuple-element.1, %constant.39)

A nested tuple's element reads `%t#i#j`. XLA's parser makes the get-tuple-element back, and so does
ours: one instruction per element, named `t#k` (a name XLA's own never take, so it cannot clash),
placed before its first user. It
carries nothing of its own (no sharding, no metadata): XLA's dump elides every get-tuple-element but a
root, its sharding included, so nothing else can be read back. Printed
back (`planner.hlo.text.printer`), it is written out as a line under a name XLA's parser accepts.
"""

from __future__ import annotations

from planner.hlo.ir.module import Attribute, Instruction
from planner.hlo.ir.shapes import TupleShape

SEPARATOR = "#"


def is_element_name(name: str) -> bool:
    return SEPARATOR in name


def split_element_name(name: str) -> tuple[str, int] | None:
    """`("t", k)` for `t#k`, or None when `name` is not of that form."""
    base, sep, index = name.rpartition(SEPARATOR)
    if not sep or not base or not index.isdigit():
        return None
    return base, int(index)


def element_problem(name: str, defined: dict[str, Instruction]) -> str | None:
    """Why `name` (`t#k`) names no tuple element here, or None when it does."""
    split = split_element_name(name)
    if split is None:
        return f"'{name}' is not an operand name: a tuple element is written %name#index"
    base, index = split
    source = defined.get(base)
    if source is None:
        if SEPARATOR in base:
            return element_problem(base, defined)
        return None  # reported as an undefined operand, with the usual message
    if not isinstance(source.shape, TupleShape):
        return (
            f"operand '{name}' reads element {index} of '{base}', which is {source.shape.to_text(False)}, not a tuple"
        )
    if index >= len(source.shape.elements):
        return f"operand '{name}': '{base}' has {len(source.shape.elements)} tuple elements, no element {index}"
    return None


def make_elements(operands: tuple[str, ...], defined: dict[str, Instruction], line: int) -> list[Instruction]:
    """The get-tuple-element instructions for the `t#k` operands not yet defined, each entered in `defined`.

    Operands that name no tuple element are left alone: the caller reports them (`element_problem`).
    """
    made: list[Instruction] = []
    for name in operands:
        if SEPARATOR not in name or name in defined:
            continue
        split = split_element_name(name)
        if split is None:
            continue
        base, index = split
        if SEPARATOR in base and base not in defined:
            made.extend(make_elements((base,), defined, line))  # `t#i#j`: element j of element i
        if base not in defined or element_problem(name, defined) is not None:
            continue
        source = defined[base]
        assert isinstance(source.shape, TupleShape)
        element = Instruction(
            name,
            "get-tuple-element",
            source.shape.elements[index],
            (base,),
            (Attribute("index", index, str(index)),),
            line=line,
        )
        defined[name] = element
        made.append(element)
    return made

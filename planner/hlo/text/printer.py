"""`HloModule` -> HLO text that XLA's parser (and ours) reads back.

Attributes are printed exactly as they were written, so nothing the planner
does not model is lost; operands are printed by name without inline types.
A tuple element read as `%t#k` (`planner.hlo.text.tuple_operands`) is printed as the
get-tuple-element line it stands for, under a name every XLA parser reads.
"""

from __future__ import annotations

from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape, Shape
from planner.hlo.text.tuple_operands import SEPARATOR


def print_module(module: HloModule) -> str:
    lines = [_header(module)]
    for section, entries in module.debug_tables:
        lines.append("")
        lines.append(section)
        lines.extend(f"{ident} {value}" for ident, value in entries)
    for comp in module.computations:
        lines.append("")
        lines.extend(print_computation(comp))
    return "\n".join(lines) + "\n"


def print_computation(comp: Computation) -> list[str]:
    params = ", ".join(f"{p.name}: {_shape_text(p.shape, with_layout=False)}" for p in comp.parameters)
    signature = f"({params}) -> {_shape_text(comp.root.shape, with_layout=False)}"
    extra = "".join(f", {key}={text}" for key, text in comp.extra)
    head = f"{'ENTRY ' if comp.is_entry else ''}%{comp.name} {signature} {{"
    names = _printed_names(comp)
    body = [f"  {print_instruction(inst, inst.name == comp.root_name, names)}" for inst in comp.instructions]
    return [head, *body, "}" + extra]


def print_instruction(inst: Instruction, is_root: bool = False, names: dict[str, str] | None = None) -> str:
    """One line; `names` maps instruction names that XLA's parser does not read to the ones printed."""
    names = names or {}
    if inst.opcode == "parameter":
        args = str(inst.parameter_number)
    elif inst.opcode == "constant":
        args = inst.literal or ""
    else:
        args = ", ".join(f"%{names.get(o, o)}" for o in inst.operands)
    attrs = "".join(f", {a.key}={a.text}" for a in inst.attributes)
    root = "ROOT " if is_root else ""
    return f"{root}%{names.get(inst.name, inst.name)} = {_shape_text(inst.shape)} {inst.opcode}({args}){attrs}"


def _printed_names(comp: Computation) -> dict[str, str]:
    """`t#k` -> `t.elementK`, `t#i#j` -> `t.elementI.elementJ` (a numeric suffix where the computation has
    that name already)."""
    taken = {inst.name for inst in comp.instructions}
    names: dict[str, str] = {}
    for inst in comp.instructions:
        if SEPARATOR not in inst.name:
            continue
        base = inst.name.replace(SEPARATOR, ".element")
        candidate, suffix = base, 0
        while candidate in taken:
            suffix += 1
            candidate = f"{base}.{suffix}"
        taken.add(candidate)
        names[inst.name] = candidate
    return names


def _header(module: HloModule) -> str:
    return f"HloModule {module.name}" + "".join(f", {a.key}={a.text}" for a in module.attributes)


def _shape_text(shape: Shape, with_layout: bool = True) -> str:
    if isinstance(shape, ArrayShape):
        return shape.to_text(with_layout)
    return shape.to_text(with_layout)

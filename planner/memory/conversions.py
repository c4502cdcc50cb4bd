"""Element types as each backend holds them: what XLA:CPU widens and XLA:TPU narrows.

See `backends`: XLA:CPU computes bf16/f16 in f32 (temporaries, whole loop-invariant elements a body
slices converted and hoisted, stacked dot results accumulated in f32); XLA:TPU reads default-precision f32 dot
operands as bf16 (a residual only dots read, or only conversions to a half float, is stored as bf16).
"""

from __future__ import annotations

from planner.hlo.ir.module import Computation, HloModule, Instruction
from planner.hlo.ir.shapes import ArrayShape
from planner.hlo.structure.loops import invariant_elements
from planner.memory.buffers import (
    Value,
    array_leaves,
    is_sharding_annotation,
    leaf_shardings,
    per_device_bytes,
    sharding_of,
)
from planner.propagation import PropagationResult
from planner.sharding.hlo_sharding import HloSharding
from planner.targets import Backend

# Ops that move or relabel a value's elements without computing on them (and Sharding annotations,
# which XLA's sharding remover takes out of every chain below).
_LAYOUT_OPS = frozenset({"reshape", "bitcast", "transpose", "copy"})
# Reading a stacked buffer on its way to a dot: the dot reads the same elements.
_DOT_VIEWS = _LAYOUT_OPS | {"dynamic-slice", "get-tuple-element"}
# Writing a dot's result into a stacked buffer: the slice written is the dot's elements.
_UPDATE_VIEWS = _LAYOUT_OPS | {"broadcast", "convert"}


def read_only_by_dots(module: HloModule, members: list[Value]) -> bool:
    """Whether every read of a loop-carried buffer, through views, is a default-precision dot's operand
    or a conversion to a half float (JAX's mixed precision: f32 weights cast to bf16 for the dots).

    The buffer's members are its values in each loop (body parameters' elements and their reads);
    writes into it (dynamic-update-slice of the buffer itself) and passing it along do not read it.
    """
    reads = _loop_reads(module, members)
    return reads is not None and sum(reads) > 0


def read_at_half_precision(module: HloModule, members: list[Value]) -> bool:
    """`read_only_by_dots`, with at least one read an explicit conversion to a half float."""
    reads = _loop_reads(module, members)
    return reads is not None and reads[1] > 0


def _loop_reads(module: HloModule, members: list[Value]) -> tuple[int, int] | None:
    """(default-precision dot reads, conversions to a half float) of a carried buffer in its loops, seen
    through views; None if anything else reads it."""
    dots = conversions = 0
    for comp_name, name, _ in members:
        comp = module.computation(comp_name)
        inst = comp[name]
        if inst.opcode != "get-tuple-element" or comp[inst.operands[0]].opcode != "parameter":
            continue
        stack = [name]
        while stack:
            current = stack.pop()
            for user_name in comp.users(current):
                user = comp[user_name]
                if user.opcode == "tuple" and user_name == comp.root_name:
                    continue
                if user.opcode == "dynamic-update-slice" and user.operands[0] == current:
                    continue
                if user.opcode in _DOT_VIEWS or is_sharding_annotation(user):
                    stack.append(user_name)
                elif user.opcode == "dot" and not _explicit_precision(user):
                    dots += 1
                elif _to_half_float(user):
                    conversions += 1
                else:
                    return None
    return dots, conversions


def _to_half_float(inst: Instruction) -> bool:
    shape = inst.shape
    return inst.opcode == "convert" and isinstance(shape, ArrayShape) and shape.element_type in ("bf16", "f16")


def updating_dot(module: HloModule, members: list[Value]) -> tuple[str, str] | None:
    """(computation, dot) whose result a carried buffer is written with, slice by slice (a stacked gradient)."""
    for comp_name, name, _ in members:
        comp = module.computation(comp_name)
        inst = comp[name]
        if inst.opcode != "dynamic-update-slice":
            continue
        update = comp[inst.operands[1]]
        while True:
            if update.opcode in _UPDATE_VIEWS or is_sharding_annotation(update):
                update = comp[update.operands[0]]
            elif update.opcode == "get-tuple-element" and comp[update.operands[0]].opcode == "tuple":
                update = comp[comp[update.operands[0]].operands[update.attr("index")]]  # an inlined call's result
            else:
                break
        if update.opcode == "dot":
            return comp_name, update.name
    return None


def _explicit_precision(dot: Instruction) -> bool:
    """HIGH or HIGHEST on an operand: XLA:TPU then computes in f32 and reads it unconverted."""
    precision = dot.attr("operand_precision")
    text = getattr(precision, "text", str(precision)) if precision is not None else ""
    return "high" in text.lower()


def widened_bytes(size_bytes: int, shape: ArrayShape, target: Backend) -> int:
    """A temporary's bytes as the backend computes it: XLA:CPU keeps bf16 and f16 work in f32."""
    return size_bytes * 2 if target.widens_half_floats and shape.element_type in ("bf16", "f16") else size_bytes


def hoisted_conversions(
    module: HloModule, result: PropagationResult, computations: list[str]
) -> list[tuple[Instruction, ArrayShape, int, str]]:
    """(While, element, bytes, label) for each half-float loop-invariant element XLA:CPU converts whole before the loop
    (`hoisted_conversion_elements`, without the element's sharding)."""
    found = hoisted_conversion_elements(module, result, computations)
    return [(loop, leaf, size, label) for loop, leaf, _, size, label in found]


def hoisted_conversion_elements(
    module: HloModule, result: PropagationResult, computations: list[str]
) -> list[tuple[Instruction, ArrayShape, HloSharding | None, int, str]]:
    """(While, element, its sharding, bytes, label) for each half-float loop-invariant element XLA:CPU converts
    whole before the loop.

    XLA:CPU computes bf16 work in f32: float normalization converts the element a body slices to f32
    whole (the slice with it), and, the element being loop-invariant, while-loop-invariant code motion
    hoists that conversion out of the loop. The loop then carries the f32 copy in the element's place:
    `bytes` is what the copy adds to the bf16 element, as much again. Measured on the grid's bf16 steps,
    what XLA:CPU allocates less with --xla_disable_hlo_passes=while-loop-invariant-code-motion against
    the sum of `bytes` here: GPT-2, remat of dots, data2 x fsdp2 x tp2: 92.5 MiB (320.5 -> 228.0) vs 93.1;
    GPT-2, no remat, tp8: 137.7 (411.6 -> 273.9) vs 137.6; Llama LM with tied embedding, AdamW, bf16:
    257.6 (842.3 -> 584.7) vs 265.6. An element only passed along or written into is not converted;
    remat's opt-barrier passes the slice through.
    """
    found: list[tuple[Instruction, ArrayShape, HloSharding | None, int, str]] = []
    for comp_name in computations:
        for loop in module.computation(comp_name).instructions:
            if loop.opcode != "while":
                continue
            body = module.computation(loop.attr("body").names[0])
            if not body.parameters:
                continue
            shardings = leaf_shardings(loop.shape, sharding_of(result, loop.name))
            leaves = array_leaves(loop.shape)
            for index in sorted(invariant_elements(body)):
                leaf = leaves[index] if index < len(leaves) else None
                if leaf is None or leaf.element_type not in ("bf16", "f16"):
                    continue
                if _sliced_into_f32_work(body, index):
                    size = per_device_bytes(leaf, shardings[index])
                    found.append((loop, leaf, shardings[index], size, f"{loop.name}[{index}] converted to f32"))
    return found


def _sliced_into_f32_work(body: Computation, index: int) -> bool:
    """Whether the body reads carried element `index` through a dynamic-slice into work (not a move)."""
    param = body.parameters[0].name
    stack = [
        r
        for user in body.users(param)
        if body[user].opcode == "get-tuple-element" and body[user].attr("index") == index
        for r in body.users(user)
        if body[r].opcode == "dynamic-slice"
    ]
    while stack:
        current = stack.pop()
        for user in body.users(current):
            op = body[user].opcode
            if op in _LAYOUT_OPS or is_sharding_annotation(body[user]):
                stack.append(user)
            elif op == "tuple":
                # Remat: the slice goes through an opt-barrier with its tuple; follow its element out.
                stack.extend(_through_barriers(body, user, current))
            elif op != "dynamic-update-slice":
                return True
    return False


def _through_barriers(body: Computation, tuple_name: str, element: str) -> list[str]:
    """The reads of `element` of tuple `tuple_name` out of the opt-barriers that take the tuple."""
    positions = [k for k, o in enumerate(body[tuple_name].operands) if o == element]
    reads = []
    for barrier in body.users(tuple_name):
        if body[barrier].opcode != "opt-barrier":
            continue
        reads += [r for r in body.users(barrier)
                  if body[r].opcode == "get-tuple-element" and body[r].attr("index") in positions]  # fmt: skip
    return reads

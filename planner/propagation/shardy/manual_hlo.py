"""A shard_map's shardings where XLA writes them in `sharding=` rather than in frontend attributes.

XLA up to libtpu 0.0.50's writes a shard_map's in-shardings, out-shardings and manual axes as
frontend attributes of its two custom calls (`xla.sdy.in_shardings`, `xla.sdy.out_shardings`,
`xla.sdy.manual_axes`). libtpu 0.0.52's dump writes none of them; the same facts are in the
shardings it prints natively (`planner.sharding.named_text`), one Llama step's attention:

    %shard_map.62 = bf16[8,8,2048,128] custom-call(%x), custom_call_target="Sharding",
        custom_call_has_side_effect=true, sharding={mesh['fsdp'=8,...], [{'fsdp'}, {}, {}, {}]}
    %shard_map.64 = (...) custom-call(%shard_map.56, ..., %shard_map.62, ...),
        custom_call_target="xla.sdy.GlobalToLocalShape", sharding={{mesh[...], manual}, ...}
    %shard_map.74 = bf16[8,32,2048,128] custom-call(%body_result),
        custom_call_target="xla.sdy.LocalToGlobalShape", sharding={mesh[...], [{'fsdp'}, {}, {}, {}]}

Each operand of the GlobalToLocalShape is a `Sharding` call holding that operand's in-sharding, the
GlobalToLocalShape's own elements say which axes are manual (`manual`: all of the mesh's; `manual={...}`:
those), and the LocalToGlobalShape's sharding is the out-shardings. Anything else is refused: a shard_map
whose shardings cannot be read would be propagated as if unconstrained.
"""

from __future__ import annotations

from planner.errors import UnsupportedHlo
from planner.hlo.ir.module import Instruction
from planner.hlo.text.shardy_import import named_shardings
from planner.sharding.shardy import TensorSharding


def manual_axes_of(inst: Instruction) -> tuple[str, ...]:
    """The manual axes a GlobalToLocalShape's (or LocalToGlobalShape's body call's) `sharding=` names: one set,
    the same on every element."""
    named = named_shardings(inst)
    axes = {tuple(a.name for a in n.manual) for n in named if n is not None}
    if len(axes) != 1 or None in named or not next(iter(axes)):
        raise UnsupportedHlo(f"{inst.name}: a shard_map without xla.sdy.manual_axes whose sharding names no one set "
                             "of manual axes")  # fmt: skip
    return axes.pop()


def in_shardings_of(inst: Instruction, operands: list[Instruction]) -> list[TensorSharding]:
    """A GlobalToLocalShape's in-shardings, read from the `Sharding` call before each operand."""
    shardings = []
    for operand in operands:
        named = named_shardings(operand)
        if operand.attr("custom_call_target") != "Sharding" or len(named) != 1 or named[0] is None:
            raise UnsupportedHlo(f"{inst.name}: a shard_map without xla.sdy.in_shardings whose operand {operand.name} "
                                 "is not a Sharding call with a named sharding")  # fmt: skip
        shardings.append(named[0].sharding)
    return shardings


def out_shardings_of(inst: Instruction) -> list[TensorSharding]:
    """A LocalToGlobalShape's out-shardings, its own `sharding=`, one per result."""
    named = named_shardings(inst)
    if not named or any(n is None or n.manual for n in named):
        raise UnsupportedHlo(f"{inst.name}: a shard_map without xla.sdy.out_shardings whose sharding is not one "
                             "named sharding per result")  # fmt: skip
    return [n.sharding for n in named if n is not None]

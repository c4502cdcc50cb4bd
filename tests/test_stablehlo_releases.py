"""StableHLO text from jax 0.7.1 and from jax 0.12, each read by whichever jaxlib is installed.

The same real step (`fidelity.syntax_fixtures`) was lowered by each release; beside its `as_text()` lies
the HLO that release's own jaxlib converts it to (`.stablehlo.hlo`). Read on the other release's jaxlib,
the text must become the same module: the forms that changed between them (a boolean constant's hex
layout, replica groups over mesh axes) are rewritten into ones the installed MLIR reads, with the same
meaning. Run on both stacks (`make test` and `make test-jax-today`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from planner import parse_hlo
from planner.errors import HloParseError
from planner.hlo.ir.attributes import COMPUTATION_ATTRIBUTES
from planner.hlo.ir.frontend_attributes import FrontendAttributes
from planner.hlo.ir.module import HloModule
from planner.hlo.text.stablehlo_compat import _bools_in_own_layout, _explicit_replica_groups
from planner.hlo.text.stablehlo_text import read_stablehlo
from planner.memory import memory_report
from planner.prepare import prepare

pytest.importorskip("jaxlib", reason="StableHLO is read through jaxlib (the jax extra)")

FIXTURES = Path(__file__).parent / "fixtures"
RELEASES = ("jax_0_7_1", "jax_0_12")
WINDOW, SEQ = 4, 16  # the sliding-window mask constant of the fixture step


def _text(release: str, partitioner: str, form: str) -> str:
    return (FIXTURES / release / f"syntax_step_{partitioner}.{form}").read_text()


# Attributes that name other instructions or computations (each jaxlib numbers its own way), and
# `is_stable`, which jaxlib 0.7.1's topk does not have (a tie order: it moves no data between devices).
_NAMING = (*COMPUTATION_ATTRIBUTES, "metadata", "is_stable")


def _structure(module: HloModule) -> list[tuple[object, ...]]:
    """Every instruction's opcode, shape, literal and attributes (shardings, backend configs, replica groups,
    frontend attributes...), computation by computation."""
    return [(inst.opcode, str(inst.shape), inst.literal, *((a.key, _value(a.value)) for a in inst.attributes
             if a.key not in _NAMING)) for comp in module.computations for inst in comp.instructions]  # fmt: skip


def _value(value: object) -> object:
    """A shard_map body call's `inlineable` mark is the converter's own (jaxlib 0.7.1 writes "false", 0.12
    "xla_late"), not the text's: it tells XLA when to inline the call, and the planner inlines every call."""
    if isinstance(value, FrontendAttributes):
        return replace(value, items=tuple(item for item in value.items if item[0] != "inlineable"))
    return value


@pytest.mark.parametrize("partitioner", ["gspmd", "shardy"])
@pytest.mark.parametrize("release", RELEASES)
def test_stablehlo_reads_as_the_writing_release_converts_it(release: str, partitioner: str) -> None:
    ours = parse_hlo(read_stablehlo(_text(release, partitioner, "stablehlo.mlir")))
    theirs = parse_hlo(_text(release, partitioner, "stablehlo.hlo"))
    assert _structure(ours) == _structure(theirs)
    # and so the same plan input: the same per-device bytes after propagation
    assert memory_report(prepare(ours, "cpu")).total_bytes == memory_report(prepare(theirs, "cpu")).total_bytes


def _mask_hex(release: str) -> str:
    text = _text(release, "gspmd", "stablehlo.mlir")
    start = text.index('dense<"0x') + len('dense<"0x')
    assert text.startswith(f'"> : tensor<{SEQ}x{SEQ}xi1>', text.index('"', start))
    return text[start : text.index('"', start)]


def test_boolean_constants_move_between_the_two_layouts_value_for_value() -> None:
    causal = np.tril(np.ones((SEQ, SEQ), dtype=bool))
    mask = (causal & ~np.tril(causal, -WINDOW)).reshape(-1)
    one_per_byte, packed = _mask_hex("jax_0_12"), _mask_hex("jax_0_7_1")
    assert bytes.fromhex(one_per_byte) == mask.astype(np.uint8).tobytes()
    assert bytes.fromhex(packed) == np.packbits(mask, bitorder="little").tobytes()
    typed = f" : tensor<{SEQ}x{SEQ}xi1>"
    assert _bools_in_own_layout(f'dense<"0x{packed}">{typed}', True) == f'dense<"0x{one_per_byte}">{typed}'
    assert _bools_in_own_layout(f'dense<"0x{one_per_byte}">{typed}', False) == f'dense<"0x{packed}">{typed}'
    # Each layout is left as it is where it is already the reader's.
    assert _bools_in_own_layout(f'dense<"0x{one_per_byte}">{typed}', True) == f'dense<"0x{one_per_byte}">{typed}'
    assert _bools_in_own_layout(f'dense<"0x{packed}">{typed}', False) == f'dense<"0x{packed}">{typed}'


def test_replica_groups_over_an_undeclared_mesh_are_an_error_at_their_line() -> None:
    text = _text("jax_0_12", "shardy", "stablehlo.mlir")
    line = next(n for n, t in enumerate(text.splitlines(), 1) if "replica_group_mesh_axes<mesh = @mesh_0" in t)
    with pytest.raises(HloParseError) as raised:
        read_stablehlo(text.replace("mesh = @mesh_0", "mesh = @nowhere", 1))
    assert raised.value.line == line and "nowhere" in str(raised.value)


def test_replica_groups_over_an_inline_mesh_and_a_sub_axis() -> None:
    """StableHLO's own form with the mesh written inline; y:(1)2 is y's major half, so over mesh [x=2, y=4]
    (device = 4x + y) each group pairs the devices whose y differs by 2."""
    mesh = ('#stablehlo.mesh<axes = [#stablehlo.mesh_axis<name = "x", size = 2>, '
            '#stablehlo.mesh_axis<name = "y", size = 4>]>')  # fmt: skip
    text = (f"replica_groups = #stablehlo.replica_group_mesh_axes<mesh = {mesh}, "
            'axes = [#stablehlo.axis_ref<name = "y", sub_axis_info = (1)2>]>, use_global_device_ids')  # fmt: skip
    assert _explicit_replica_groups(text) == (
        "replica_groups = dense<[[0, 2], [1, 3], [4, 6], [5, 7]]> : tensor<4x2xi64>, use_global_device_ids"
    )
    declared = 'sdy.mesh @m = <["x"=2, "y"=4]>\n'
    named = 'replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @m, axes = [#stablehlo.axis_ref<name = "x">]>'
    assert _explicit_replica_groups(declared + named).endswith(
        "replica_groups = dense<[[0, 4], [1, 5], [2, 6], [3, 7]]> : tensor<4x2xi64>"
    )


def test_an_inline_mesh_as_mlir_prints_it_and_small_boolean_constants_stay() -> None:
    """MLIR prints a mesh's axes without their attribute prefix; a one-byte boolean constant of up to eight
    elements is a splat in either layout (or packed bits): it is left as written."""
    text = ('replica_groups = #stablehlo.replica_group_mesh_axes<mesh = #stablehlo.mesh<axes = [<name = "x", '
            'size = 2>, <name = "y", size = 4>]>, axes = [#stablehlo.axis_ref<name = "x">]>')  # fmt: skip
    assert _explicit_replica_groups(text) == (
        "replica_groups = dense<[[0, 4], [1, 5], [2, 6], [3, 7]]> : tensor<4x2xi64>"
    )
    for layout in (True, False):
        assert _bools_in_own_layout('dense<"0x01"> : tensor<4xi1>', layout) == 'dense<"0x01"> : tensor<4xi1>'
    # Eight elements one byte each are unambiguous, and pack into one byte.
    assert _bools_in_own_layout('dense<"0x0100000000000001"> : tensor<8xi1>', False) == 'dense<"0x81"> : tensor<8xi1>'

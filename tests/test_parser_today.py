"""HLO text as today's XLA writes it, from a real jax 0.12 step (`fidelity.syntax_fixtures`).

The fixture step holds what older printers did not write: `%t#k` operands (XLA's dump elides plain
get-tuple-elements), Shardy shardings written natively in `sharding=` (open dims, sub-axes, manual axes),
collectives whose replica groups are mesh axes, `topk(..., is_stable=true)`. Each partitioner's module is
kept as XLA's dump, `as_text(dialect="hlo")` and `as_text()`; the XLA:CPU numbers of its compile beside.
Where jaxlib 0.12 is installed, our reading of named shardings is checked against XLA's own conversion.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fidelity.agreement import while_shape_mismatches
from planner import parse_hlo
from planner.errors import HloParseError, PlannerError
from planner.hlo.ir.attributes import ReplicaGroups
from planner.hlo.text.shardy_import import SHARDY, module_mesh, partitioner_of
from planner.memory import memory_report
from planner.prepare import prepare
from planner.sharding.text import parse_sharding

FIXTURES = Path(__file__).parent / "fixtures" / "jax_0_12"
RECORD = json.loads((FIXTURES / "syntax_step.xla.json").read_text())
HLO_FORMS = ("xla_dump.hlo", "lowered.hlo")


def _text(partitioner: str, form: str) -> str:
    return (FIXTURES / f"syntax_step_{partitioner}.{form}").read_text()


@pytest.mark.parametrize("partitioner", ["gspmd", "shardy"])
@pytest.mark.parametrize("form", HLO_FORMS)
def test_every_form_of_today_s_text_parses(partitioner: str, form: str) -> None:
    module = parse_hlo(_text(partitioner, form))
    assert partitioner_of(module) == (SHARDY if partitioner == "shardy" else "gspmd")
    if partitioner == "shardy":
        mesh = module_mesh(module)
        assert mesh is not None and (mesh.axis_names, mesh.shape) == (("fsdp", "tp"), (2, 4))


def test_the_dump_s_tuple_elements_are_get_tuple_elements() -> None:
    text = _text("gspmd", "xla_dump.hlo")
    assert "get-tuple-element" not in text and "#1" in text
    module = parse_hlo(text)
    elements = [i for c in module.computations for i in c.instructions if "#" in i.name]
    assert elements and all(i.opcode == "get-tuple-element" for i in elements)
    for comp in module.computations:
        seen: set[str] = set()
        for inst in comp.instructions:
            assert all(o in seen for o in inst.operands), f"{inst.name} reads an element placed after it"
            seen.add(inst.name)


def test_gspmd_forms_partition_the_loops_as_xla_cpu_did() -> None:
    for form in HLO_FORMS:
        compared, misses = while_shape_mismatches(
            prepare(parse_hlo(_text("gspmd", form)), "cpu"), RECORD["gspmd"]["post_partition_while_shapes"]
        )
        assert compared > 0 and misses == [], (form, misses)


def test_gspmd_forms_size_alike() -> None:
    """The lowered text keeps a loop condition's unread get-tuple-elements, which the dump never writes; XLA's
    HloDCE removes them before it assigns buffers, so both forms hold the same bytes."""
    totals = {form: memory_report(prepare(parse_hlo(_text("gspmd", form)), "cpu")).total_bytes for form in HLO_FORMS}
    assert len(set(totals.values())) == 1, totals


def test_replica_groups_over_mesh_axes_are_the_device_groups_gspmd_writes() -> None:
    """The Shardy dump's `replica_groups=mesh['fsdp'=2,'tp'=4] {'tp'}` against the GSPMD lowering's explicit
    groups for the same all-reduces."""

    def groups(text: str) -> list[tuple[tuple[int, ...], ...]]:
        module = parse_hlo(text)
        found = [i.attr("replica_groups") for c in module.computations for i in c.instructions
                 if i.opcode == "all-reduce"]  # fmt: skip
        assert all(isinstance(g, ReplicaGroups) for g in found)
        return sorted(g.groups for g in found)

    shardy = _text("shardy", "xla_dump.hlo")
    assert "replica_groups=mesh[" in shardy
    assert groups(shardy) == groups(_text("gspmd", "lowered.hlo"))


def test_topk_is_stable_is_read() -> None:
    module = parse_hlo(_text("gspmd", "xla_dump.hlo"))
    topk = [i for c in module.computations for i in c.instructions if i.opcode == "topk"]
    assert topk and all(i.attr("is_stable") is True for i in topk)


# What XLA itself prints, and its own conversion of each to the classic form (checked live below when
# jaxlib 0.12 is installed): every sharding found in the fixtures plus the forms JAX rarely writes.
NAMED = [
    "{mesh['fsdp'=2,'tp'=4], [{'fsdp'}, {}, {}]}",
    "{mesh['fsdp'=2,'tp'=4], [{'tp', 'fsdp'}, {}]}",
    "{mesh['fsdp'=2,'tp'=4], [{'tp':(2)2}, {'fsdp'}]}",
    "{mesh['fsdp'=2,'tp'=4], [{'tp':(1)2}, {'fsdp'}]}",
    "{mesh['fsdp'=2,'tp'=4], [{'fsdp', ?}, {?}]}",
    "{mesh['fsdp'=2,'tp'=4], [{'fsdp'}, {}], replicated={'tp'}}",
    "{mesh['fsdp'=2,'tp'=4], [{'tp'}], manual={'fsdp'}}",
    "{mesh['fsdp'=2,'tp'=4], [{?}, {?}], manual={'tp'}}",
    "{mesh['fsdp'=2,'tp'=4], manual}",
    "{mesh['fsdp'=2,'tp'=4], replicated}",
    "{mesh[], replicated}",
    "{mesh['x'=2,'y'=2], device_ids=(0,2,1,3), [{'x'}]}",
    "{mesh['a'=2,'b'=4], device_ids=([4,2]T(1,0)), [{'a'}, {}]}",
    "{mesh['a'=2,'b'=2,'c'=2], device_ids=(7,6,5,4,3,2,1,0), [{'c'}, {'a'}]}",
    "{single_device[device_id=3]}",
    "{{mesh['fsdp'=2,'tp'=4], [{'fsdp'}]}, {mesh[], replicated}}",
]


def _fixture_shardings() -> list[str]:
    import re

    found: set[str] = set()
    for path in FIXTURES.glob("*.xla_dump.hlo"):
        found |= set(
            re.findall(r"sharding=(\{mesh\[[^\n]*?\]\}|\{mesh\[[^\n]*?(?:replicated|manual)\})", path.read_text())
        )
    return sorted(found)


@pytest.mark.parametrize("text", NAMED + _fixture_shardings())
def test_named_shardings_place_data_as_xla_s_own_conversion(text: str) -> None:
    xla_client = pytest.importorskip("jax._src.lib").xla_client
    if not hasattr(xla_client.HloSharding, "v3_to_v2_sharding"):
        pytest.skip("this jaxlib predates named shardings: the jax 0.12 run checks against XLA")
    classic = xla_client.HloSharding.from_string(text).v3_to_v2_sharding().to_string()
    assert parse_sharding(text) == parse_sharding(classic), classic


def test_a_tuple_sharding_mixing_named_and_classic_elements_names_the_mesh() -> None:
    """XLA writes a tuple's elements each its own way (`{{mesh[], replicated}, {replicated}, ...}`), with an
    `/*index=5*/` comment every five elements."""
    elements = ", ".join(["{mesh['x'=2,'y'=4], [{'x'}]}", "{replicated}"] + ["{mesh[], replicated}"] * 3)
    sharding = "{" + elements + ", /*index=5*/{mesh['x'=2,'y'=4], [{'y'}]}}"
    shape = "(" + ", ".join(["f32[8]"] * 6) + ")"
    module = parse_hlo(
        f"HloModule m\n\nENTRY %e (p: {shape}) -> {shape} {{\n"
        f"  ROOT %p = {shape} parameter(0), sharding={sharding}\n}}\n"
    )
    assert partitioner_of(module) == SHARDY
    mesh = module_mesh(module)
    assert mesh is not None and (mesh.axis_names, mesh.shape) == (("x", "y"), (2, 4))
    assert parse_sharding(sharding).elements[5] == parse_sharding(
        "{devices=[4,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("%add.15 = f32[8] add(%p#3, %p#0)", "'p' has 2 tuple elements, no element 3"),
        ("%add.15 = f32[8] add(%p#0#1, %p#0)", "reads element 1 of 'p#0', which is f32[8], not a tuple"),
        ("%add.15 = f32[8] add(%q#0, %p#0)", "operand 'q#0' of 'add.15' is not defined"),
        ("%add.15 = f32[8] add(%p#0, %p#0), sharding={mesh['x'=8], [{'y'}]}", 'axis "y" is not in mesh'),
        ("%add.15 = f32[8] add(%p#0, %p#0), sharding={mesh['x'=8], [{'x'}]p}", "to close the named sharding"),
        ("%add.15 = f32[8] add(%p#0, %p#0), sharding={mesh['x'=8] [{'x'}]}", "to close the named sharding"),
        ("%add.15 = f32[8] add(%p#0, %p#0), sharding={mesh['x'=8], device_ids=(0,1), [{'x'}]}", "2 device ids"),
    ],
    ids=["index", "nested", "undefined", "axis", "junk", "comma", "ids"],
)
def test_bad_new_syntax_is_an_error_at_its_line_and_column(text: str, message: str) -> None:
    module = (
        "HloModule m\n\nENTRY %e (p: (f32[8], f32[8])) -> f32[8] {\n"
        "  %p = (f32[8], f32[8]) parameter(0)\n"
        f"  ROOT {text}\n}}\n"
    )
    with pytest.raises(PlannerError) as raised:
        parse_hlo(module)
    assert message in str(raised.value)
    if isinstance(raised.value, HloParseError):
        assert raised.value.line == 5 and raised.value.column > 1


# jaxlib 0.12 writes unreduced axes as a subgroup (`last_tile_dims={unreduced}`), and a value unreduced over
# every device as `{unreduced}`; written in any subgroup order, the canonical text is XLA's.
UNREDUCED_SHARDINGS = [
    "{devices=[2,1,2]<=[4] last_tile_dims={unreduced}}",
    "{devices=[1,1,2,2]<=[2,2]T(1,0) last_tile_dims={unreduced, replicated}}",
    "{devices=[1,1,2,2]<=[4] last_tile_dims={replicated, unreduced}}",
    "{devices=[2,2,2]<=[8] last_tile_dims={unreduced, manual}}",
    "{devices=[1,4]<=[4] last_tile_dims={unreduced}}",
    "{unreduced}",
]


@pytest.mark.parametrize("text", UNREDUCED_SHARDINGS)
def test_unreduced_subgroups_read_and_print_as_jaxlib_s(text: str) -> None:
    from planner.hlo.text.jaxlib_api import jaxlib_version

    xla_client = pytest.importorskip("jax._src.lib").xla_client
    if jaxlib_version() < (0, 12):
        pytest.skip("jaxlib before 0.12 has no unreduced shardings to compare with")
    assert parse_sharding(text).to_text() == str(xla_client.HloSharding.from_string(text))

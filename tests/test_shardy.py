"""Shardy modules: their attributes read, typed, carried over to GSPMD's vocabulary, and planned."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from planner import parse_hlo
from planner.errors import HloParseError
from planner.hlo.ir.frontend_attributes import FrontendAttributes
from planner.hlo.text.shardy_import import module_mesh, partitioner_of, resolve_mesh, to_gspmd
from planner.mesh import Mesh
from planner.prepare import prepare
from planner.propagation import propagate
from planner.sharding import parse_sharding
from planner.sharding.shardy import AxisRef, DimSharding, SdyMesh, parse_meshes, to_hlo_sharding
from planner.sharding.shardy import parse_sharding as parse_sdy

HERE = Path(__file__).resolve().parent

# Every Shardy form JAX writes: a parameter sharding, a constraint with an open dim, shard_alike, a result sharding.
MODULE = (HERE / "fixtures" / "shardy_constraints.hlo").read_text()


def hlo(text: str) -> str:
    return parse_sharding(text).to_text()


# --- reading ---------------------------------------------------------------------------------


def test_module_mesh_is_read_and_typed() -> None:
    module = parse_hlo(MODULE)
    attrs = module.attr("frontend_attributes")
    assert isinstance(attrs, FrontendAttributes)
    assert attrs.sdy_meshes == {"mesh": SdyMesh((("fsdp", 4), ("tp", 2)))}
    assert module_mesh(module) == Mesh((4, 2), ("fsdp", "tp"))
    assert partitioner_of(module) == "shardy"


def test_every_form_of_a_dim_sharding() -> None:
    (s,) = parse_sdy('#sdy.sharding<@mesh, [{"x":(2)2, "y"}, {"z", ?}p1, {?}, {}p0], replicated={"w"}>')
    assert s.mesh == "mesh"
    assert s.dims == (
        DimSharding((AxisRef("x", 2, 2), AxisRef("y"))),
        DimSharding((AxisRef("z"),), is_open=True, priority=1),
        DimSharding((), is_open=True),
        DimSharding((), priority=0),
    )
    assert s.replicated == (AxisRef("w"),)
    assert s.open_dims == (1, 2)


def test_sharding_per_value_and_inline_mesh() -> None:
    values = parse_sdy('#sdy.sharding_per_value<[<@mesh, [{"a"}]>, <mesh<["a"=2], device_ids=[1,0]>, [{}]>]>')
    assert len(values) == 2
    assert values[1].mesh == SdyMesh((("a", 2),), (1, 0))


@pytest.mark.parametrize(
    "attribute,message,at",
    [
        ('xla.sdy.meshes={mesh = #sdy.mesh<["fsdp"=4, "tp"]>}', "expected '=' after axis \"tp\"", "]>}"),
        ('xla.sdy.meshes={mesh = #sdy.mesh<["a"=4], device_ids=[0,1]>}', "not a permutation", '<["a"'),
        ('xla.sdy.meshes="{mesh = #sdy.mesh<[\\"a\\"=2]>"', "expected ',' or '}' in the meshes", '"}'),
        ("xla.sdy.meshes=mesh", "expected a quoted string or {...}", "mesh}"),
    ],
    ids=["axis_without_size", "device_ids_of_another_size", "unclosed_meshes", "bare_word"],
)
def test_malformed_mesh_is_located(attribute: str, message: str, at: str) -> None:
    header = f"HloModule m, frontend_attributes={{{attribute}}}"
    text = f"{header}\n\nENTRY e {{\n  ROOT p = f32[4] parameter(0)\n}}\n"
    with pytest.raises(HloParseError) as e:
        parse_hlo(text)
    assert message in e.value.message
    assert (e.value.line, e.value.column) == (1, header.rindex(at) + 1)


def test_malformed_sharding_is_located_inside_the_string() -> None:
    text = MODULE.replace('[{\\"fsdp\\"}, {\\"tp\\"}]', '[{\\"fsdp\\"}, {\\"tp\\" \\"x\\"}]')
    with pytest.raises(HloParseError) as e:
        parse_hlo(text)
    assert "or '}' in a dim sharding" in e.value.message
    line = text.splitlines()[e.value.line - 1]
    assert e.value.line == 4
    assert line[e.value.column - 1 :].startswith('\\"x\\"')


@pytest.mark.parametrize(
    "attribute,message,at",
    [
        ('xla.sdy.manual_axes="#sdy<manual_axes{\\"a\\" \\"b\\"}>"', "or '}' in the manual axes", '\\"b'),
        ('xla.sdy.manual_axes="#sdy<manual{\\"a\\"}>"', "to open the manual axes", "#sdy<manual{"),
        ('xla.sdy.in_shardings="#sdy.sharding_per_value<[<@mesh, [{\\"a\\"]>]>"', "in a dim sharding", "]>]"),
    ],
    ids=["manual_axes_without_comma", "manual_axes_misspelt", "in_shardings_unclosed_dim"],
)
def test_malformed_shard_map_attribute_is_located(attribute: str, message: str, at: str) -> None:
    """A shard_map's Shardy attributes are read with the module: a bad one is an error at its place."""
    line = f'  ROOT g = f32[4] custom-call(p), custom_call_target="xla.sdy.GlobalToLocalShape", frontend_attributes={{{attribute}}}'
    text = f"HloModule m\n\nENTRY e {{\n  p = f32[4] parameter(0)\n{line}\n}}\n"
    with pytest.raises(HloParseError) as e:
        parse_hlo(text)
    assert message in e.value.message
    assert (e.value.line, e.value.column) == (5, line.index(at) + 1)


# --- GSPMD equivalents -----------------------------------------------------------------------

FSDP_TP = {"mesh": SdyMesh((("fsdp", 4), ("tp", 2)))}


@pytest.mark.parametrize(
    "sdy,rank,expected",
    [
        ('[{"fsdp"}, {"tp"}]', 2, "{devices=[4,2]<=[8]}"),
        ('[{"tp"}, {}]', 2, "{devices=[2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}"),
        ('[{}, {"fsdp"}]', 2, "{devices=[1,4,2]<=[8] last_tile_dim_replicate}"),
        ('[{"tp", "fsdp"}]', 1, "{devices=[8]<=[4,2]T(1,0)}"),
        ("[{}, {}]", 2, "{replicated}"),
        # fsdp=4 splits as (1)2 then (2)2: the minor half of fsdp with tp.
        ('[{"fsdp":(2)2}, {"tp"}]', 2, "{devices=[2,2,2]<=[2,2,2]T(1,2,0) last_tile_dim_replicate}"),
        ('[{"fsdp":(1)2}, {}]', 2, "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"),
    ],
    ids=["2d", "tp_only", "fsdp_on_dim1", "two_axes_one_dim", "replicated", "minor_sub_axis", "major_sub_axis"],
)
def test_conversion_to_hlo_sharding(sdy: str, rank: int, expected: str) -> None:
    (s,) = parse_sdy(f"#sdy.sharding<@mesh, {sdy}>")
    assert to_hlo_sharding(s, FSDP_TP, rank) == parse_sharding(expected)


def test_explicit_device_order_and_maximal_mesh() -> None:
    meshes = {"m": SdyMesh((("a", 2), ("b", 2)), (3, 1, 2, 0)), "one": SdyMesh((), (5,))}
    (s,) = parse_sdy('#sdy.sharding<@m, [{"b"}, {}]>')
    # Devices [[3,1],[2,0]] (a x b); b first: [[3,2],[1,0]] -> tiles [2,1,2].
    assert to_hlo_sharding(s, meshes, 2) == parse_sharding("{devices=[2,1,2]3,2,1,0 last_tile_dim_replicate}")
    (m,) = parse_sdy("#sdy.sharding<@one, []>")
    assert to_hlo_sharding(m, meshes, 0) == parse_sharding("{maximal device=5}")


def test_conversion_refuses_what_has_no_gspmd_form() -> None:
    (s,) = parse_sdy('#sdy.sharding<@mesh, [{"fsdp"}, {"fsdp"}]>')
    with pytest.raises(ValueError, match="used twice"):
        to_hlo_sharding(s, FSDP_TP, 2)
    (s,) = parse_sdy('#sdy.sharding<@mesh, [{"dp"}]>')
    with pytest.raises(ValueError, match='axis "dp" is not in mesh'):
        to_hlo_sharding(s, FSDP_TP, 1)


@cache
def jax_shardy_modules(tmp: Path) -> list[str]:
    out = tmp / "shardy_reference.json"
    subprocess.run([sys.executable, str(HERE / "shardy_reference.py"), str(out)], check=True, timeout=600)
    return json.loads(out.read_text())


@pytest.mark.xla
def test_conversion_matches_xla_export_on_jax_modules(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every parameter JAX lowers with both forms: our conversion of the Shardy one is XLA's GSPMD one."""
    compared = 0
    for text in jax_shardy_modules(tmp_path_factory.mktemp("sdy")):
        module = parse_hlo(text)
        meshes = module.attr("frontend_attributes").sdy_meshes
        for inst in module.entry.instructions:
            attrs = inst.attr("frontend_attributes")
            if inst.opcode != "parameter" or attrs is None or attrs.sdy_sharding is None:
                continue
            (value,) = attrs.sdy_sharding
            assert to_hlo_sharding(value, meshes, inst.shape.rank) == inst.sharding, (inst.name, value.to_text())
            compared += 1
    assert compared == 24


# --- the module in GSPMD's terms ---------------------------------------------------------------


def test_sdy_only_module_gets_gspmd_shardings_groups_and_open_dims() -> None:
    module, gone = to_gspmd(parse_hlo(MODULE))
    assert gone == {}  # the root is the result's call itself: its copy is the output
    entry = module.entry
    assert entry["p"].sharding == parse_sharding("{devices=[4,2]<=[8]}")
    assert entry["c"].sharding == parse_sharding("{devices=[1,2,4]<=[4,2]T(1,0) last_tile_dim_replicate}")
    assert entry["c"].attr("backend_config") == "unspecified_dims=[0]"
    assert entry["g"].attr("custom_call_target") == "Sharding"
    assert entry["g"].sharding.shard_group.id == 0 and entry["g"].sharding.shard_group.shard_as
    assert entry["g"].shape == entry["c"].shape
    assert entry["r"].attr("custom_call_target") == "Sharding"
    assert entry["r"].sharding == parse_sharding("{devices=[8,1]<=[8]}")


RESULTS = """HloModule m, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["fsdp"=2, "tp"=4]>}}

ENTRY e {
  p = f32[8,1024]{1,0} parameter(0), frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{}, {}]>"}
  q = f32[8,1024]{1,0} parameter(1), frontend_attributes={xla.sdy.sharding="#sdy.sharding<@mesh, [{}, {\\"fsdp\\"}]>"}
  a = f32[8,1024]{1,0} add(p, q)
  m = f32[8,1024]{1,0} multiply(p, q)
  ra = f32[8,1024]{1,0} custom-call(a), custom_call_target="xla.sdy.FuncResultSharding", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{}, {}]>]>"}
  rm = f32[8,1024]{1,0} custom-call(m), custom_call_target="xla.sdy.FuncResultSharding", custom_call_has_side_effect=true, frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{?}, {}]>]>"}
  ROOT t = (f32[8,1024]{1,0}, f32[8,1024]{1,0}) tuple(ra, rm)
}
"""


def test_function_results_are_the_roots_shardings_not_their_operands() -> None:
    """XLA's Shardy import makes a closed FuncResultSharding the function's result sharding and returns
    its operand: `a` is free to take `q`'s split, the output is replicated. One with open dims stays a
    constraint."""
    module, gone = to_gspmd(parse_hlo(RESULTS))
    entry = module.entry
    assert gone == {"ra": "a"}
    assert entry.root.operands == ("a", "rm")
    assert "ra" not in entry and entry["a"].sharding is None
    assert entry.root.sharding is None  # `rm`'s element has no closed sharding to give the root
    assert entry["rm"].attr("custom_call_target") == "Sharding"
    result = propagate(prepare(parse_hlo(RESULTS)))
    assert result.sharding("a") == parse_sharding("{devices=[1,2,4]<=[8] last_tile_dim_replicate}")


def test_gspmd_forms_already_written_are_kept() -> None:
    text = MODULE.replace("parameter(0),", "parameter(0), sharding={replicated},")
    assert to_gspmd(parse_hlo(text))[0].entry["p"].sharding == parse_sharding("{replicated}")


def test_sdy_only_module_propagates() -> None:
    result = propagate(prepare(parse_hlo(MODULE)))
    assert result.sharding("n") == parse_sharding("{devices=[4,2]<=[8]}")


def test_module_mesh_replaces_and_checks_the_given_mesh() -> None:
    module = parse_hlo(MODULE)
    assert resolve_mesh(module, None) == Mesh((4, 2), ("fsdp", "tp"))
    assert resolve_mesh(module, Mesh((4, 2), ("fsdp", "tp"))) == Mesh((4, 2), ("fsdp", "tp"))
    with pytest.raises(
        ValueError, match=r"--mesh fsdp=2,tp=4 conflicts with the mesh the module declares .*fsdp=4,tp=2"
    ):
        resolve_mesh(module, Mesh((2, 4), ("fsdp", "tp")))


def test_gspmd_module_is_untouched() -> None:
    text = "HloModule m\n\nENTRY e {\n  ROOT p = f32[4] parameter(0), sharding={replicated}\n}\n"
    module = parse_hlo(text)
    assert partitioner_of(module) == "gspmd"
    assert to_gspmd(module) == (module, {})
    assert parse_meshes("{}") == {}


def test_shardy_lowered_text_says_which_outputs_are_pinned() -> None:
    """JAX returns a pinned output through a FuncResultSharding call with closed dims; a free one directly or
    through open dims. `{replicated}` on the root, which JAX writes for both, is not consulted."""
    from planner.hlo.text.compile_defaults import output_flags_from_root

    text = RESULTS.replace("HloModule m,", "HloModule jit_step,")
    assert output_flags_from_root(parse_hlo(text)) == (False, True)
    direct = text.replace("tuple(ra, rm)", "tuple(ra, m)")
    assert output_flags_from_root(parse_hlo(direct)) == (False, True)
    # A scalar returned directly (jax 0.7.1 writes no call for one pinned to P()) follows the others.
    scalar = (
        text.replace("ROOT t = (f32[8,1024]{1,0}, f32[8,1024]{1,0}) tuple(ra, rm)",
                     "s = f32[] constant(1)\n  ROOT t = (f32[], f32[8,1024]{1,0}) tuple(s, ra)")
    )  # fmt: skip
    assert output_flags_from_root(parse_hlo(scalar)) == (False, False)
    free = text.replace("tuple(ra, rm)", "tuple(a, m)")
    assert output_flags_from_root(parse_hlo(free)) == (True, True)


@pytest.mark.parametrize(
    ("text", "reduction"),
    [
        ('#sdy.sharding<@mesh, [{?}, {"b", ?}], unreduced=max{"c"}>', "max"),
        ('#sdy.sharding<@mesh, [{"a"}, {}], unreduced=min{"b", "c"}>', "min"),
        ('#sdy.sharding<@mesh, [{"a"}, {}], unreduced={"b"}>', "sum"),
    ],
)
def test_unreduced_axes_keep_their_reduction(text: str, reduction: str) -> None:
    """Shardy (jax >= 0.12) writes how unreduced axes combine before the axes; a sum is written bare."""
    (sharding,) = parse_sdy(text)
    assert sharding.reduction == reduction
    assert "#sdy.sharding" + sharding.to_text() == text


def test_unreduced_axes_may_come_without_the_equals_sign() -> None:
    """Shardy's parser takes `unreduced{...}` as `unreduced={...}`."""
    (sharding,) = parse_sdy('#sdy.sharding<@mesh, [{"a"}, {}], unreduced{"b"}>')
    assert [a.name for a in sharding.unreduced] == ["b"]

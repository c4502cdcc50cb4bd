"""Mesh, chip presets, byte counts and per-chip accounting."""

from __future__ import annotations

import pytest

from planner import parse_hlo
from planner.memory import chip, memory_report, parse_bytes
from planner.mesh import Mesh
from planner.prepare import prepare
from planner.units import format_bytes


def test_mesh_parse_and_errors() -> None:
    mesh = Mesh.parse("fsdp=4,tp=2")
    assert (mesh.shape, mesh.axis_names, mesh.device_ids) == ((4, 2), ("fsdp", "tp"), tuple(range(8)))
    with pytest.raises(ValueError, match="expected name=size"):
        Mesh.parse("fsdp:4")
    with pytest.raises(ValueError, match=r"shape=\(4,\) does not match axis_names=\('a', 'b'\)"):
        Mesh((4,), ("a", "b"))


@pytest.mark.parametrize(
    "text,value", [("32GiB", 32 * 2**30), ("80GB", 80 * 10**9), ("1024", 1024), ("1.5 MiB", 3 * 2**19)]
)
def test_parse_bytes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize(
    "value,text",
    [
        (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (650 * 2**20, "650.0 MiB"),
        (2**20 - 1, "1.0 MiB"),  # rounds up to 1,024 KiB: the next unit
        (729_190 * 2**20 + 2**19, "712.1 GiB"), (3 * 2**40, "3.0 TiB"), (5000 * 2**40, "5,000.0 TiB"),
        (-3 * 2**30, "-3.0 GiB"),
    ],
)  # fmt: skip
def test_format_bytes_picks_the_binary_unit_per_magnitude(value: int, text: str) -> None:
    assert format_bytes(value) == text
    if value >= 1024:
        assert parse_bytes(text.replace(",", "")) == pytest.approx(value, rel=0.05)


def test_chip_presets() -> None:
    # What XLA:TPU lets one program hold (tests/test_chip_capacity.py compiles at that edge), not the 32 GiB.
    assert chip("v6e").hbm_bytes == 33_545_781_248 < 32 * 2**30
    assert chip("H100").hbm_bytes == 80 * 10**9
    with pytest.raises(ValueError, match="unknown chip 'v9'"):
        chip("v9")


def test_maximal_sharding_lands_on_one_chip() -> None:
    module = parse_hlo(
        """HloModule m, num_partitions=4

ENTRY e {
  a = f32[1024] parameter(0), sharding={maximal device=2}
  b = f32[1024] parameter(1), sharding={devices=[4]<=[4]}
  ROOT t = (f32[1024], f32[1024]) tuple(a, b), sharding={{maximal device=2}, {devices=[4]<=[4]}}
}
"""
    )
    report = memory_report(prepare(module, mesh=Mesh.parse("x=4")))
    per_chip = report.per_chip_bytes
    # Chip 2 holds the whole of `a` (4 KiB) besides its quarter of `b`; the others only their quarter.
    assert per_chip[2] - per_chip[0] == 4096 * 2  # parameter and output copies of `a`
    assert per_chip[0] == per_chip[1] == per_chip[3]


def test_mesh_must_fit_the_module() -> None:
    module = parse_hlo("HloModule m, num_partitions=8\n\nENTRY e {\n  ROOT p = f32[8] parameter(0)\n}\n")
    with pytest.raises(ValueError, match="mesh x=4 has 4 devices but the module has num_partitions=8"):
        prepare(module, mesh=Mesh.parse("x=4"))


def test_donated_parameters_are_not_counted_twice() -> None:
    text = """HloModule m, num_partitions=2, input_output_alias={ {0}: (0, {}, may-alias) }

ENTRY e {
  w = f32[1024] parameter(0), sharding={devices=[2]<=[2]}
  g = f32[1024] parameter(1), sharding={devices=[2]<=[2]}
  n = f32[1024] subtract(w, g), sharding={devices=[2]<=[2]}
  ROOT t = (f32[1024], f32[1024]) tuple(n, g), sharding={{devices=[2]<=[2]}, {devices=[2]<=[2]}}
}
"""
    report = memory_report(prepare(parse_hlo(text)))
    # Each device: two 2 KiB parameters, two 2 KiB outputs (+16 B tuple table); output 0 reuses w.
    assert report.argument_bytes == 4096
    assert report.output_bytes == 4096 + 16
    assert report.alias_bytes == 2048
    assert report.total_bytes == report.argument_bytes + report.output_bytes + report.temp_bytes - 2048


# A tuple whose elements are read one by one, the first long before the second: XLA's dump writes the
# log-softmax's results this way (`%t#0` read by the loss, `%t#1` only by the backward).
TUPLE_READ_APART = """HloModule m, num_partitions=1

ENTRY e {
  p = f32[1024,1024]{1,0} parameter(0)
  a = f32[1024,1024]{1,0} negate(p)
  b = f32[1024,1024]{1,0} exponential(p)
  t = (f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) tuple(a, b)
  a0 = f32[1024,1024]{1,0} get-tuple-element(t), index=0
  s = f32[1024,1024]{1,0} sine(a0)
  c = f32[1024,1024]{1,0} cosine(s)
  b1 = f32[1024,1024]{1,0} get-tuple-element(t), index=1
  ROOT out = f32[1024,1024]{1,0} add(b1, c)
}
"""


def test_a_tuple_element_dies_at_its_own_last_reader() -> None:
    """A get-tuple-element uses only the tuple's table, not the elements it does not select (XLA's
    `HloValue` uses): reading `b` late does not keep `a` alive to that point."""
    from planner.memory.model import _estimate_in_order
    from planner.propagation import propagate

    prepared = prepare(parse_hlo(TUPLE_READ_APART), "cpu")
    estimate = _estimate_in_order(prepared.module, propagate(prepared), None, "cpu")
    position = {inst.name: k for k, inst in enumerate(prepared.module.entry.instructions)}
    span = {b.defined_by: (b.start, b.end) for b in estimate.buffers}
    assert span["a"] == (position["a"], position["s"])
    assert span["b"] == (position["b"], position["out"])

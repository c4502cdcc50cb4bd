"""Which compiler a chip preset stands for, and the TPU slice verification compiles for."""

from __future__ import annotations

import pytest

from planner.memory import CHIPS
from planner.targets import BACKENDS, backend, tpu_topology


def test_every_chip_preset_names_its_compiler() -> None:
    # `plan --chip NAME` predicts for backend NAME: every preset must be one.
    assert set(CHIPS) <= set(BACKENDS)
    assert {backend(name).compiler for name in ("v4", "v5e", "v5p", "v6e")} == {"tpu"}
    assert {backend(name).compiler for name in ("h100", "h200")} == {"gpu"}
    assert not backend("v6e").widens_half_floats


@pytest.mark.parametrize(
    ("jaxlib", "widens"), [("0.7.1", True), ("0.10.2", True), ("0.12.0.1", False), ("0.13.0", False), (None, False)]
)
def test_xla_cpu_widens_half_floats_before_jax_0_12(
    monkeypatch: pytest.MonkeyPatch, jaxlib: str | None, widens: bool
) -> None:
    """The cpu target is the installed jaxlib's XLA:CPU; with none, today's."""
    import planner.targets as targets

    def installed(package: str) -> str:
        if jaxlib is None:
            raise targets.PackageNotFoundError(package)
        return jaxlib

    monkeypatch.setattr(targets, "version", installed)
    assert targets._xla_cpu_widens_half_floats() is widens


@pytest.mark.parametrize(
    ("chip", "num_devices", "topology"),
    [
        # The slices the reference sweep compiled for with libtpu 0.0.20.
        ("v6e", 8, "v6e:2x4"),
        ("v6e", 256, "v6e:16x16"),
        ("v5e", 8, "v5e:2x4"),
        ("v5e", 256, "v5e:16x16"),
        # Past one physical slice (a v6e pod is 256 chips): what libtpu 0.0.20 still describes.
        ("v6e", 512, "v6e:16x32"),
        ("v5p", 8, "v5p:2x2x2"),
        ("v4", 8, "v4:2x2x1"),
    ],
)
def test_tpu_topology_is_a_slice_libtpu_describes(chip: str, num_devices: int, topology: str) -> None:
    assert tpu_topology(chip, num_devices) == topology


def test_no_tpu_topology_for_a_gpu_or_an_odd_v4_count() -> None:
    assert tpu_topology("h100", 8) is None
    assert tpu_topology("v4", 7) is None

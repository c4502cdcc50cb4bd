"""Next steps when sharding is not enough: each option predicted, and compiled by XLA:TPU.

The step that does not fit: Llama 3.1 405B's layer shapes at sequence 1024 on fsdp=64, tp=4 (256
chips), no remat, gradients free. Before the plan its gradients do not fit a v6e; after it (every
gradient pinned) its saved activations do not. Each option is a real step too, lowered by JAX from
abstract inputs and compiled ahead of time (`fidelity.cases.NEXT_STEP_CASES`, cached by content
under `~/.cache/spmd-planner/fidelity`). XLA:TPU refuses to compile a step whose temporaries exceed the chip's HBM,
so the steps that do not fit a v6e are compiled for a v5p (95 GiB), the same compiler on a larger
chip, and predicted for v5p there; remat with pinned gradients fits a v6e and is compiled for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from planner import parse_hlo_file
from planner.hlo.ir.module import HloModule
from planner.memory import chip, memory_report
from planner.mesh import Mesh
from planner.plan.fixes.next_steps import (
    Step,
    beyond_sharding,
    predict_more_fsdp_chips,
    predict_smaller_microbatch,
)
from planner.plan.fixes.remesh import axis_layout, move_sharding
from planner.plan.model import Plan
from planner.prepare import prepare
from planner.propagation import propagate
from planner.sharding.text import parse_sharding

GENERATED = Path(__file__).parent / "fixtures" / "generated"
MESH = Mesh.parse("fsdp=4,tp=2")

# -- moving shardings to another mesh (no compiler) -------------------------------------------------


@pytest.mark.parametrize(
    ("sharding", "layout"),
    [
        ("{devices=[1,4,2]<=[8]}", ((), ("fsdp",), ("tp",))),
        ("{devices=[1,2,4]<=[4,2]T(1,0)}", ((), ("tp",), ("fsdp",))),
        ("{devices=[4,1,1,2]<=[8] last_tile_dim_replicate}", (("fsdp",), (), (), ("tp",))),
        ("{devices=[8,1]<=[4,2]T(1,0)}", (("tp", "fsdp"), ())),
        ("{devices=[4,2]0,1,2,3,4,5,6,7}", (("fsdp",), ("tp",))),
        # fsdp split over two dims, and a device order no axis order gives: no layout.
        ("{devices=[2,2,2]<=[8]}", None),
        ("{devices=[4,2]0,2,1,3,4,6,5,7}", None),
    ],
    ids=["fsdp_tp", "tp_fsdp", "batch_fsdp", "tp_major_fsdp", "explicit_list", "split_axis", "no_axis_order"],
)
def test_axis_layout_reads_each_tile_dim_as_mesh_axes(sharding: str, layout: tuple | None) -> None:
    assert axis_layout(parse_sharding(sharding), MESH) == layout


@pytest.mark.parametrize(
    ("sharding", "new_mesh", "split", "moved"),
    [
        ("{devices=[1,4,2]<=[8]}", "fsdp=8,tp=2", None, "{devices=[1,8,2]<=[16]}"),
        ("{devices=[2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}", "fsdp=8,tp=2", None,
         "{devices=[2,1,8]<=[8,2]T(1,0) last_tile_dim_replicate}"),
        ("{replicated}", "fsdp=8,tp=2", None, "{replicated}"),
        # A new axis replicates, unless it splits a dim: then it is that dim's minor-most axis.
        ("{devices=[1,4,2]<=[8]}", "fsdp=4,tp=2,microbatch=2", None,
         "{devices=[1,4,2,2]<=[16] last_tile_dim_replicate}"),
        ("{devices=[4,1,1,2]<=[8] last_tile_dim_replicate}", "fsdp=4,tp=2,microbatch=2", (0, "microbatch"),
         "{devices=[8,1,1,2]<=[4,2,2]T(0,2,1) last_tile_dim_replicate}"),
    ],
    ids=["grow_fsdp", "grow_fsdp_partial", "replicated", "new_axis_replicates", "new_axis_splits_batch"],
)  # fmt: skip
def test_move_sharding_keeps_each_dims_axes(sharding: str, new_mesh: str, split: tuple | None, moved: str) -> None:
    assert move_sharding(parse_sharding(sharding), MESH, Mesh.parse(new_mesh), split) == parse_sharding(moved)


def _step(module: HloModule, mesh: Mesh, capacity: int, backend: str) -> Step:
    prepared = prepare(module, backend, mesh)
    return Step(prepared, propagate(prepared), capacity)


def test_small_step_options_and_holders_add_up() -> None:
    """On the committed 8-device Shardy step (no remat) with a capacity it does not fit: every option is
    predicted, more chips and a smaller batch each lower the bytes, and the holders add up to the total."""
    module = parse_hlo_file(GENERATED / "jax_llama_shardy_L8_fsdp4_tp2.hlo")
    step = _step(module, MESH, 100 << 20, "v6e")
    mesh = step.mesh
    assert mesh is not None
    total = step.estimate().total_bytes
    holders, steps, unavailable = beyond_sharding(step)
    assert unavailable == []
    assert sum(h.per_device_bytes for h in holders) == total
    # Free gradients there: the stacked gradients hold the most; the residuals are there too.
    assert holders[0].kind == "stacked-gradients" and "saved-activations" in {h.kind for h in holders}
    by_kind = {s.kind: s for s in steps}
    assert set(by_kind) == {"remat", "more-fsdp-chips", "smaller-microbatch"}
    assert all(s.predicted_total < total and s.fits is False for s in steps)
    assert by_kind["more-fsdp-chips"].settings["fsdp"] == 8
    assert by_kind["smaller-microbatch"].settings["microbatch_fraction"] == 0.5


# -- the 405B-shaped step against XLA:TPU -------------------------------------------------------------

MESH_405B = Mesh.parse("fsdp=64,tp=4")
V6E = chip("v6e").hbm_bytes
BEFORE = "jax_llama405b_noremat_free_S1024_L126_fsdp64_tp4"  # v5p
AFTER = "jax_llama405b_noremat_pinned_S1024_L126_fsdp64_tp4"  # v5p: the plan's result; half of HALF_FROM
REMAT = "jax_llama405b_remat_pinned_S1024_L126_fsdp64_tp4"  # v6e
FSDP128 = "jax_llama405b_noremat_pinned_B128_S1024_L126_fsdp128_tp4"  # v5p, 512 chips, one sample per chip
HALF_FROM = "jax_llama405b_noremat_pinned_B128_S1024_L126_fsdp64_tp4"  # two samples per chip (module only)
# The same step at sequence 2048 (module only: no TPU has room to compile it) and its remat (v6e).
S2048 = "jax_llama405b_noremat_pinned_L126_fsdp64_tp4"
REMAT_S2048 = "jax_llama_full_bf16_gspmd_fsdp64_tp4_L126_D16384_pinned"

# |predicted - XLA:TPU| / XLA:TPU against XLA:TPU's HBM (its buffer assignment in memory space 0, the sweep's
# measure): what was measured (in the comment), rounded up a little. The sweep's band for XLA:TPU
# (planner/data/memory_accuracy.json) is far wider; these steps are the model's best case, and the bounds are
# there to catch a regression. Remat is the per-buffer accounting (planner.plan.fixes.next_steps). Against the
# compiled statistics' total these were -17.8% (remat) and -6.3% (remat_s2048): the statistics add VMEM and
# 2 GB no allocation of XLA:TPU's lists.
TOLERANCE = {
    "before": 0.005,  # +0.38%
    "after": 0.01,  # +0.85%
    "remat": 0.03,  # -2.85%
    "remat_s2048": 0.08,  # +7.57%
    "fsdp128": 0.006,  # +0.50%
    "fsdp128_from_b128": 0.006,  # +0.51%
    "half_batch": 0.008,  # +0.76%
}


@pytest.fixture(scope="module")
def references() -> dict[str, tuple[Path, dict[str, Any]]]:
    from fidelity.cases import NEXT_STEP_CASES, case_named
    from fidelity.references import ensure_references, reference_path

    cases = [*NEXT_STEP_CASES, case_named(REMAT_S2048)]
    failed = ensure_references(cases)
    assert not failed, f"references failed to generate: {failed}"
    found = {}
    for case in cases:
        path = reference_path(case)
        found[case.name] = (path, json.loads(path.with_suffix(".xla.json").read_text()))
    return found


def _tpu(references: dict, name: str, topology: str) -> int:
    """XLA:TPU's HBM per chip for the reference (the sweep's measure, `fidelity.sweep.compiler_bytes`)."""
    from fidelity.sweep import compiler_bytes

    record = references[name][1]
    assert record["tpu"]["topology"] == topology
    return compiler_bytes(record, "tpu")


@pytest.fixture(scope="module")
def plans(references: dict) -> dict[str, tuple[Plan, HloModule]]:
    from planner.plan.planner import make_plan

    return {
        name: make_plan(prepare(parse_hlo_file(references[name][0]), "v6e", MESH_405B), V6E)
        for name in (BEFORE, HALF_FROM, S2048)
    }


@pytest.mark.xla
def test_405b_does_not_fit_before_or_after_the_plan_and_remat_does(references: dict, plans: dict) -> None:
    plan, _ = plans[BEFORE]
    assert plan.verdict is not None and plan.verdict.fits_before is False and plan.verdict.fits_after is False
    assert plan.hbm.total_before > V6E and plan.hbm.total_after > V6E
    # XLA:TPU agrees: the compiled step needs more than a v6e has before and after (v6e would not compile
    # it: its temporaries alone exceed the chip), and with remat on top of the pins it fits a v6e.
    assert _tpu(references, BEFORE, "v5p:8x8x4") > V6E and _tpu(references, AFTER, "v5p:8x8x4") > V6E
    assert _tpu(references, REMAT, "v6e:16x16") < V6E
    steps = {s.kind: s for s in plan.next_steps}
    assert [s.kind for s in plan.next_steps] == ["remat", "more-fsdp-chips", "smaller-microbatch"]
    assert steps["remat"].fits is True and steps["remat"].predicted_total < V6E
    # One sample per chip already: more chips shrink weights and gradients only, and half the batch
    # pads to the same per-chip shapes. Neither fits.
    assert steps["more-fsdp-chips"].fits is False and steps["more-fsdp-chips"].settings["fsdp"] == 128
    assert steps["smaller-microbatch"].fits is False
    assert steps["smaller-microbatch"].settings["batch_per_chip"] == 1
    # At sequence 2048 too: nothing to pin, does not fit; remat fits, as XLA:TPU compiles it for a v6e.
    at_2048, _ = plans[S2048]
    assert at_2048.placements == [] and at_2048.verdict is not None and at_2048.verdict.fits_after is False
    assert next(s for s in at_2048.next_steps if s.kind == "remat").fits is True
    assert _tpu(references, REMAT_S2048, "v6e:16x16") < V6E


@pytest.mark.xla
def test_405b_peak_holders_name_the_saved_activations(plans: dict) -> None:
    plan, _ = plans[BEFORE]
    holders = {h.kind: h for h in plan.peak_holders}
    assert sum(h.per_device_bytes for h in plan.peak_holders) == plan.hbm.total_after
    assert plan.peak_holders[0].kind == "saved-activations"
    assert holders["saved-activations"].per_device_bytes > 0.8 * plan.hbm.total_after
    # The largest residual is the softmax's f32 attention probabilities, named at their source line.
    assert "f32[126,1,32,1024,1024] per device" in holders["saved-activations"].items[0]
    assert "fidelity/models.py:" in holders["saved-activations"].items[0]
    assert "(exp)" in holders["saved-activations"].items[0]
    assert holders["parameters"].items[0].startswith("params['w_")
    assert "gradient of params['w_" in holders["stacked-gradients"].items[0]


def _predicted(option: str, references: dict, plans: dict) -> int:
    """Our bytes per chip for the option, for the compiler it was compiled with."""
    _, patched = plans[BEFORE]
    if option == "before":
        return memory_report(prepare(parse_hlo_file(references[BEFORE][0]), "v5p", MESH_405B)).total_bytes
    if option == "after":
        return _step(patched, MESH_405B, V6E, "v5p").estimate().total_bytes
    if option in ("remat", "remat_s2048"):
        remat_from, _ = plans[BEFORE if option == "remat" else S2048]
        return next(s.predicted_total for s in remat_from.next_steps if s.kind == "remat")
    if option == "fsdp128":
        return predict_more_fsdp_chips(_step(patched, MESH_405B, V6E, "v5p"), 2)
    _, from_b128 = plans[HALF_FROM]
    if option == "fsdp128_from_b128":
        return predict_more_fsdp_chips(_step(from_b128, MESH_405B, V6E, "v5p"), 2)
    assert option == "half_batch"
    return predict_smaller_microbatch(_step(from_b128, MESH_405B, V6E, "v5p"), 2)


COMPILED = {
    "before": (BEFORE, "v5p:8x8x4"),
    "after": (AFTER, "v5p:8x8x4"),
    "remat": (REMAT, "v6e:16x16"),
    "remat_s2048": (REMAT_S2048, "v6e:16x16"),
    "fsdp128": (FSDP128, "v5p:8x8x8"),
    "fsdp128_from_b128": (FSDP128, "v5p:8x8x8"),
    "half_batch": (AFTER, "v5p:8x8x4"),
}


@pytest.mark.xla
@pytest.mark.parametrize("option", list(COMPILED))
def test_405b_option_predicted_against_xla_tpu(option: str, references: dict, plans: dict) -> None:
    name, topology = COMPILED[option]
    compiled = _tpu(references, name, topology)
    predicted = _predicted(option, references, plans)
    error = (predicted - compiled) / compiled
    print(f"{option}: predicted {predicted / 1e9:.2f} GB, XLA:TPU ({topology}) {compiled / 1e9:.2f} GB, {error:+.2%}")
    assert abs(error) <= TOLERANCE[option], f"{option}: {error:+.2%}"

"""The configuration search: candidates, ranking, the cost it ranks by, and a small search on a local Ray."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO
from live_server import live_server

from planner.hlo.text.parser import parse_hlo
from planner.mesh import Mesh
from planner.plan.cost import dot_flops_per_device
from planner.prepare import prepare
from planner.propagation import propagate
from planner.search.candidates import Candidate, candidate_grid, factorizations
from planner.search.evaluate import Evaluation, load_builder
from planner.search.ranking import rank

MIB = 1 << 20


def test_meshes_are_every_ordered_factorization_of_the_chip_count() -> None:
    assert factorizations(8, 2) == [(1, 8), (2, 4), (4, 2), (8, 1)]
    assert len(factorizations(256, 3)) == 45  # 2^8 over 3 axes: C(10, 2)
    grid = candidate_grid(8, ("fsdp", "tp"), (None, "full"), (1, 2), ("v6e",))
    assert len(grid) == 16 and grid[0].label() == "fsdp=1,tp=8 remat=none microbatches=1 v6e"
    with pytest.raises(ValueError, match=r"microbatches=0 must be >= 1"):
        Candidate((("fsdp", 8),), None, 0, "v6e")


def _evaluation(fsdp: int, after_mib: int | None, flops: int, microbatches: int = 1) -> Evaluation:
    candidate = Candidate((("fsdp", fsdp), ("tp", 8 // fsdp)), None, microbatches, "v6e")
    if after_mib is None:
        return Evaluation(candidate, error="ValueError: does not divide")
    return Evaluation(candidate, 100 * MIB, 200 * MIB, after_mib * MIB, flops)


def test_fitting_candidates_rank_by_compute_for_the_batch_then_headroom() -> None:
    cheap, costly, tight = _evaluation(2, 60, 10), _evaluation(4, 40, 30), _evaluation(8, 90, 10)
    two_steps = _evaluation(1, 50, 10, microbatches=2)  # half the batch per step, twice the steps: 20
    over, far_over, failed = _evaluation(2, 120, 1), _evaluation(4, 150, 1), _evaluation(8, None, 0)
    ranked = rank([failed, far_over, costly, over, tight, two_steps, cheap])
    assert ranked == [cheap, tight, two_steps, costly, over, far_over, failed]
    assert [e.fits for e in ranked] == [True] * 4 + [False] * 3


def test_dot_flops_count_each_device_s_share_of_each_dot_as_often_as_it_runs() -> None:
    """The worked example of `planner.plan.cost`: a [4, 2048] partial product over 128 contracted elements
    per device, inside a loop of 8 iterations."""
    text = """HloModule flops, num_partitions=8

body {
  p = (s32[], f32[8,512], f32[512,2048]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  one = s32[] constant(1)
  next = s32[] add(i, one)
  a = f32[8,512] get-tuple-element(p), index=1, sharding={devices=[2,4]<=[8]}
  b = f32[512,2048] get-tuple-element(p), index=2, sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
  d = f32[8,2048] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  ROOT t = (s32[], f32[8,512], f32[512,2048]) tuple(next, a, b)
}

cond {
  p = (s32[], f32[8,512], f32[512,2048]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(8)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY main {
  a = f32[8,512] parameter(0), sharding={devices=[2,4]<=[8]}
  b = f32[512,2048] parameter(1), sharding={devices=[4,1,2]<=[8] last_tile_dim_replicate}
  zero = s32[] constant(0)
  init = (s32[], f32[8,512], f32[512,2048]) tuple(zero, a, b)
  w = (s32[], f32[8,512], f32[512,2048]) while(init), condition=cond, body=body
  ROOT d = f32[8,2048] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
}
"""
    prepared = prepare(parse_hlo(text), "cpu", Mesh.parse("x=8"))
    per_dot = 2 * 4 * 2048 * 128
    assert per_dot == 2_097_152
    assert dot_flops_per_device(prepared.module, propagate(prepared)) == per_dot * (1 + 8)


def test_no_device_does_less_than_its_share_of_a_dot() -> None:
    """Output rows split 8 ways and the contracted dim split 8 ways over the same 8 devices: the split is
    not counted twice (XLA reshards an operand first); each device computes a [1, 2048] row over all 512."""
    text = """HloModule shared, num_partitions=8

ENTRY main {
  a = f32[8,512] parameter(0), sharding={devices=[1,8]<=[8]}
  b = f32[512,2048] parameter(1), sharding={replicated}
  ROOT d = f32[8,2048] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[8,1]<=[8]}
}
"""
    prepared = prepare(parse_hlo(text), "cpu", Mesh.parse("x=8"))
    assert dot_flops_per_device(prepared.module, propagate(prepared)) == 2 * 1 * 2048 * 512


def test_a_builder_that_cannot_be_loaded_is_named() -> None:
    with pytest.raises(ValueError, match=r"step builder 'nocolon' is not MODULE:FUNCTION"):
        load_builder("nocolon")
    with pytest.raises(ValueError, match=r"cannot import 'no_such_module_here' for the step builder"):
        load_builder("no_such_module_here:build")
    with pytest.raises(ValueError, match=r"planner.units has no function 'nothing'"):
        load_builder("planner.units:nothing")


@pytest.mark.xla
def test_a_small_search_on_local_ray_ranks_plans_and_compiles_the_best(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(tmp_path)}
    env.pop("XLA_FLAGS", None)
    command = [str(Path(sys.executable).parent / "spmd-planner"), "search", "search_llama_jax:build", "--devices", "8",
               "--axes", "fsdp,tp", "--remat", "none,full,dots", "--chip", "v6e", "--top", "2", "--num-cpus", "2"]  # fmt: skip
    with live_server(tmp_path / "plans.sqlite3") as url:
        done = subprocess.run([*command, "--url", url], capture_output=True, text=True, timeout=900, env=env,
                              cwd=REPO / "examples")  # fmt: skip
        (page,) = [line.removeprefix("dashboard: ") for line in done.stdout.splitlines() if line.startswith("dash")]
        with urllib.request.urlopen(page, timeout=30) as r:
            html = r.read().decode()
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "12 candidates, ranked" in out
    rows = [line for line in out.splitlines() if line.startswith(" ") and line[:3].strip().isdigit()]
    assert len(rows) == 12
    # The builder knows no `dots` remat: those four fail with its reason, ranked last.
    assert all("remat=dots" in r and "failed: ValueError: remat='dots': this builder knows none and full" in r
               for r in rows[8:])  # fmt: skip
    # Every mesh fits 32 GiB; without remat the step costs less than with it, so remat=none ranks first.
    assert all("remat=none" in r for r in rows[:4]) and all("remat=full" in r for r in rows[4:8])
    # The best two were compiled by XLA:TPU for a v6e slice of 8 chips, and the report says so.
    assert all("XLA:TPU (v6e:2x4)" in r for r in rows[:2]) and not any("XLA:TPU" in r for r in rows[2:])
    best = out.splitlines()[-1]
    assert best.startswith(
        f"best: {rows[0].split()[1]} remat=none microbatches=1 v6e, confirmed by XLA:TPU (v6e:2x4): "
    )
    assert best.endswith(" of 31.2 GiB"), best
    # The service holds the ranking: its page draws the eight planned candidates and the two compiles.
    assert html.count('<g class="candidate">') == 8 and html.count('class="compiled"') == 2


def test_search_without_ray_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    from cli.main import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert main(["search", "search_llama_jax:build", "--devices", "8"]) == 2
    assert "search needs ray, which is not installed: pip install 'spmd-planner[search]'" in capsys.readouterr().err

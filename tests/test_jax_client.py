"""The JAX client: a scanned Llama-like step planned from abstract inputs and trained with the plan applied.

The example runs in a subprocess of its own (XLA reads its CPU device count once per process): it lowers
the step with free gradients, plans it in process, compiles it plain and with the plan's pins inside
`scan`, and trains a few SGD steps.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from live_server import live_server

from planner.plan.model import Plan
from planner.plan.verdict import band_of

EXAMPLE = REPO / "examples" / "train_llama_scan_jax.py"


def run_example(partitioner: str, cache: Path, url: str | None = None) -> dict:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    env.pop("XLA_FLAGS", None)
    command = [sys.executable, str(EXAMPLE), "--partitioner", partitioner, "--json", *(["--url", url] if url else [])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.xla
@pytest.mark.parametrize("partitioner", ["gspmd", "shardy"])
def test_the_planned_step_compiles_with_every_gradient_at_its_planned_sharding(
    partitioner: str, tmp_path: Path
) -> None:
    got = run_example(partitioner, tmp_path)
    planned, before, after = got["planned_specs"], got["gradient_specs_before"], got["gradient_specs_after"]
    # XLA alone leaves the projections' stacked gradients without their fsdp split (both partitioners).
    wrong_before = sorted(n for n, spec in got["parameter_specs"].items() if before[n] != spec)
    assert {"['layers']['w_down']", "['layers']['w_up']", "['layers']['wq']"} <= set(wrong_before)
    # The plan pins every one of them, each to its parameter's sharding, and XLA compiles them so.
    assert set(wrong_before) <= set(planned)
    for name, spec in planned.items():
        assert spec == got["parameter_specs"][name], name
        assert after[name] == spec, (name, after[name], spec)
    # The plan names the partitioner it simulated: the module's own.
    assert got["plan_partitioner"] == partitioner
    # XLA:CPU's bytes for the planned step are within the sweep's band for this kind of step.
    band = band_of("cpu", partitioner, "jax")
    assert band is not None
    error = (got["predicted_after_bytes"] - got["xla_after_bytes"]) / got["xla_after_bytes"]
    assert band.under <= error <= band.over, (error, band)
    assert got["xla_after_bytes"] < got["xla_before_bytes"]
    # It trains: SGD with the plan lowers the loss.
    losses = got["losses"]
    assert all(b < a for a, b in itertools.pairwise(losses)), losses


@pytest.mark.xla
def test_the_service_plans_the_jax_step_as_the_client_does_in_process(tmp_path: Path) -> None:
    local = run_example("gspmd", tmp_path / "local")
    with live_server(tmp_path / "plans.sqlite3") as url:
        remote = run_example("gspmd", tmp_path / "remote", url)
    # One request, one id: the service stored the plan the client would have made itself.
    assert remote["plan_id"] == local["plan_id"]
    assert remote["planned_specs"] == local["planned_specs"]
    assert remote["gradient_specs_after"] == local["gradient_specs_after"]


def test_the_manifest_names_each_gradient_by_its_parameter_path() -> None:
    jax = pytest.importorskip("jax")
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from scan_runtime.jax import step_manifest

    mesh = Mesh(jax.devices()[:1], ("fsdp",))
    leaf = jax.ShapeDtypeStruct((4, 8, 8), "float32", sharding=NamedSharding(mesh, PartitionSpec(None, "fsdp")))
    manifest = step_manifest({"layers": {"wq": leaf, "wo": leaf}})
    assert manifest.outputs == [None, "['layers']['wo']", "['layers']['wq']"]
    assert manifest.parameter("['layers']['wq']").partition_spec == [None, "fsdp", None]
    with pytest.raises(ValueError, match=r"parameter \['w'\] has sharding None: give each parameter a NamedSharding"):
        step_manifest({"w": jax.ShapeDtypeStruct((4, 8), "float32")})


def test_a_scan_over_parameters_found_under_two_paths_asks_which() -> None:
    jax = pytest.importorskip("jax")
    from jax.sharding import PartitionSpec

    from scan_runtime.jax import JaxPlan, PlanMismatch, scan

    shape = (4, 8, 8)
    plan = JaxPlan(
        layer_specs={"['encoder']['w']": PartitionSpec("fsdp", None)},
        gradient_specs={},
        mesh=None,
        parameters={"['encoder']['w']": shape, "['decoder']['w']": shape},
        plan=Plan.model_construct(),
    )
    xs = {"w": jax.ShapeDtypeStruct(shape, "float32")}
    with pytest.raises(PlanMismatch, match=r"under each of \[\"\['decoder'\]\", \"\['encoder'\]\"\]: say which"):
        jax.eval_shape(lambda xs: scan(lambda c, p: (c, None), 0.0, xs, plan=plan), xs)
    # Named, the decoder's scan has nothing pinned and runs plainly.
    carry, _ = jax.eval_shape(lambda xs: scan(lambda c, p: (c + p["w"].sum(), None), 0.0, xs, plan=plan,
                                              path="['decoder']"), xs)  # fmt: skip
    assert carry.shape == ()


def _forward_scan_outputs(fun, xs) -> list[tuple[int, ...]]:  # type: ignore[no-untyped-def]
    """The shapes the forward scan of `grad(fun)` returns: its carry and what it stacks for the backward."""
    jax = pytest.importorskip("jax")
    scans = [e for e in jax.make_jaxpr(jax.grad(fun))(xs).jaxpr.eqns if e.primitive.name == "scan"]
    return [tuple(v.aval.shape) for v in scans[0].outvars]


def test_remat_puts_the_pins_inside_the_checkpoint_so_the_backward_keeps_no_pinned_copy() -> None:
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec

    from scan_runtime.jax import JaxPlan, scan

    mesh = Mesh(jax.devices()[:1], ("fsdp",))
    shape = (4, 8, 8)
    plan = JaxPlan(layer_specs={"['w']": PartitionSpec("fsdp", None)}, gradient_specs={}, mesh=mesh,
                   parameters={"['w']": shape}, plan=Plan.model_construct())  # fmt: skip

    def layer(c, p):  # type: ignore[no-untyped-def]
        return jnp.tanh(c @ p["w"]), None

    def loss(layer_fn, **options):  # type: ignore[no-untyped-def]
        return lambda xs: scan(layer_fn, jnp.ones((2, 8)), xs, plan=plan, **options)[0].sum()

    xs = {"w": jnp.ones(shape)}
    unpinned = _forward_scan_outputs(lambda xs: jax.lax.scan(jax.checkpoint(layer), jnp.ones((2, 8)), xs)[0].sum(), xs)
    # With the pins inside the checkpoint the forward stacks what it does unpinned: the backward reads the
    # scanned weights themselves.
    assert _forward_scan_outputs(loss(layer, remat=True), xs) == unpinned
    # Around a checkpointed layer the pinned slice is a new value: the forward stacks a copy of the weights.
    assert _forward_scan_outputs(loss(jax.checkpoint(layer)), xs) == [*unpinned, shape]

"""The JAX side on today's JAX: run by `make test-jax-today` in its own environment (jax 0.12 and its
libtpu on Python 3.12, the project installed with its JAX extras over it; JAX_TODAY names the release).

What a JAX user on that release hands over, read and verified with that release's jaxlib: the real jax 0.12
step of `tests/fixtures/jax_0_12` in all three forms (XLA's dump, `as_text(dialect="hlo")`, `as_text()`),
and `--verify` compiling with the partitioner the module names, on XLA:CPU and XLA:TPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

from fidelity.agreement import while_shape_mismatches
from planner import parse_hlo
from planner.hlo.text.shardy_import import SHARDY, partitioner_of
from planner.hlo.text.stablehlo_text import read_stablehlo
from planner.plan.compilers.verify import compile_with_xla, output_propagation
from planner.prepare import prepare

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "jax_0_12"
RECORD = json.loads((FIXTURES / "syntax_step.xla.json").read_text())
TODAY = os.environ["JAX_TODAY"]


def _text(partitioner: str, form: str) -> str:
    return (FIXTURES / f"syntax_step_{partitioner}.{form}").read_text()


def test_the_jax_extras_left_today_s_jax_in_place() -> None:
    assert version("jax") == TODAY and version("jaxlib") == TODAY
    assert version("libtpu")  # the tpu extra's libtpu, the one jax[tpu] of this release picks
    # Installing them again changes nothing: pip's own plan for the requirements the JAX extras name.
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    requirements = sorted({r for extra in ("jax", "tpu", "verify") for r in extras[extra]})
    assert requirements and all("==" not in r for r in requirements), requirements
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-", *requirements],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    report = json.loads(done.stdout)
    assert [item["metadata"]["name"] for item in report["install"]] == []


@pytest.mark.parametrize("partitioner", ["gspmd", "shardy"])
def test_stablehlo_text_of_today_s_jax_reads_as_the_hlo_text(partitioner: str) -> None:
    converted = parse_hlo(read_stablehlo(_text(partitioner, "stablehlo.mlir")))
    lowered = parse_hlo(_text(partitioner, "lowered.hlo"))
    assert partitioner_of(converted) == partitioner_of(lowered) == (SHARDY if partitioner == "shardy" else "gspmd")
    shapes = RECORD[partitioner]["post_partition_while_shapes"]
    if partitioner == "gspmd":
        compared, misses = while_shape_mismatches(prepare(converted, "cpu"), shapes)
        assert compared > 0 and misses == []


@pytest.mark.parametrize("partitioner", ["gspmd", "shardy"])
def test_verify_compiles_with_the_partitioner_the_module_names(partitioner: str) -> None:
    """XLA's dump of the step, compiled again by the installed jaxlib with the module's partitioner, allocates
    what JAX's own compile of the step allocated."""
    text = _text(partitioner, "xla_dump.hlo")
    module = parse_hlo(text)
    report = compile_with_xla(text, 8, output_propagation(module), partitioner=partitioner_of(module))
    assert report["partitioner"] == partitioner
    assert ("Shardy" if partitioner == "shardy" else "GSPMD") in report["xla"] and TODAY in report["xla"]
    assert report["total_bytes"] == RECORD[partitioner]["total_bytes"]

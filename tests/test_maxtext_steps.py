"""MaxText's train steps, compiled for TPU topologies ahead of time by MaxText's own `train_compile`
(`python -m fidelity.run_maxtext`, MaxText 0.2.5, jax 0.12, libtpu 0.0.50; each record's `argv` is the
command and its reduced layer count), planned from all three forms a user has: XLA's dump of the compile,
`lowered.as_text(dialect="hlo")` and the StableHLO text.

What holds on every step: each form is read whole and planned for the step's chip, and the three forms give
the same bytes per chip (they are one step). Under GSPMD our per-device While shapes equal XLA:TPU's. How
far the bytes are from XLA:TPU's is measured in bench/RESULTS.md (`python -m bench.maxtext_steps`).
"""

from __future__ import annotations

import json

import pytest
from conftest import REPO

from fidelity.sweep import propagation_agreement
from planner import parse_hlo_file
from planner.memory import memory_report
from planner.prepare import prepare
from planner.propagation import propagate

FIXTURES = REPO / "tests" / "fixtures" / "maxtext"
FORMS = ("xla_dump.hlo.gz", "hlo.gz", "stablehlo.mlir.gz")
STEPS = sorted(p.name.removesuffix(".xla.json") for p in FIXTURES.glob("*.xla.json"))


def _record(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.xla.json").read_text())


def _chip(record: dict) -> str:
    return str(record["topology"]).split("-")[0]  # MaxText's `v6e-8`: the chip, then its count


def test_the_maxtext_steps_cover_dense_and_expert_models_under_both_partitioners() -> None:
    records = [_record(n) for n in STEPS]
    assert {r["partitioner"] for r in records} == {"gspmd", "shardy"}
    assert any("mixtral" in r["model"] or "deepseek" in r["model"] for r in records)


@pytest.mark.parametrize("name", STEPS)
def test_every_form_of_a_maxtext_step_plans_to_the_same_bytes(name: str) -> None:
    record = _record(name)
    chip = _chip(record)
    totals = {}
    for form in FORMS:
        prepared = prepare(parse_hlo_file(FIXTURES / f"{name}.{form}"), chip)
        result = propagate(prepared)
        totals[form] = memory_report(prepared, result=result).total_bytes
        if record["partitioner"] == "gspmd":
            whiles = record["tpu"]["post_partition_while_shapes"]
            assert propagation_agreement(prepared, result, whiles) == "exact", form
    assert len(set(totals.values())) == 1, totals

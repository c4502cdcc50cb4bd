"""MaxText's train steps, compiled for TPU topologies ahead of time by MaxText's own `train_compile`
(`python -m fidelity.run_maxtext`, MaxText 0.2.5; jax 0.12 and libtpu 0.0.50 here, jax 0.12.1 and libtpu
0.0.52 under `libtpu_0_0_52/` (Llama 3 8B, Gemma 2 2B, Mixtral 8x7B at 2 layers, Llama 3 8B at its full 32
layers with `remat_policy=minimal_offloaded`); each record's `argv` is the command and its reduced layer count), planned
from all three forms a user has: XLA's dump of the compile, `lowered.as_text(dialect="hlo")` and the
StableHLO text. Each step is prepared as the libtpu that compiled it (`absent_passes`).

What holds on every step: each form is read whole and planned for the step's chip, and the three forms give
the same bytes per chip (they are one step). Our per-device While shapes equal XLA:TPU's under GSPMD, and
under Shardy on every step and form but those `SHARDY_LOOPS_DIFFER` lists (which must still differ). Our
bytes per chip stay within today's worst error against XLA:TPU's HBM (its buffer assignment's total,
`fidelity.memory_stats`: what it allocated, or for a step it refuses, what its out-of-memory error says
the step needed, the same total), and the verdict is never the opposite of XLA:TPU's. The error's spread
is in bench/RESULTS.md (`python bench/maxtext_steps.py`); the goal is 5%.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CORPUS, REPO

from fidelity.run_maxtext import reference_bytes
from fidelity.sweep import propagation_agreement
from planner import parse_hlo_file
from planner.hlo.structure.frontend import MAXTEXT, front_end_of
from planner.memory import CHIPS, memory_report
from planner.plan.verdict import DOES_NOT_FIT, FITS, VERDICT_MARGIN, band_of, call
from planner.prepare import PreparedModule, absent_passes, prepare
from planner.propagation import propagate

FIXTURES = REPO / "tests" / "fixtures" / "maxtext"
FORMS = ("xla_dump.hlo.gz", "hlo.gz", "stablehlo.mlir.gz")
# Each step by its path under FIXTURES, without the suffix: `libtpu_0_0_52/maxtext_llama3-8b_L4_v6e-8_shardy`.
STEPS = sorted(str(p.relative_to(FIXTURES)).removesuffix(".xla.json") for p in FIXTURES.glob("**/*.xla.json"))

# Shardy steps (and forms) whose While shapes still differ from XLA:TPU's, with what differs.
SHARDY_LOOPS_DIFFER: dict[str, tuple[str, ...]] = {
    # The dump's forward scan carries two splash-attention masks more (the dump elides their literals,
    # so CSE cannot merge them with their twins as XLA:TPU's does).
    "maxtext_gemma2-2b_L4_v5e-8_shardy": ("xla_dump.hlo.gz",),
    "libtpu_0_0_52/maxtext_gemma2-2b_L4_v5e-8_shardy": ("xla_dump.hlo.gz",),
}


def _record(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.xla.json").read_text())


def _prepare(name: str, form: str, record: dict) -> PreparedModule:
    """The step's form, prepared as the libtpu that compiled it."""
    return prepare(parse_hlo_file(FIXTURES / f"{name}.{form}"), _chip(record), disabled=absent_passes(record["libtpu"]))


def _chip(record: dict) -> str:
    return str(record["topology"]).split("-")[0]  # MaxText's `v6e-8`: the chip, then its count


def test_the_maxtext_steps_cover_dense_and_expert_models_under_both_partitioners() -> None:
    records = [_record(n) for n in STEPS]
    assert {r["partitioner"] for r in records} == {"gspmd", "shardy"}
    assert any("mixtral" in r["model"] or "deepseek" in r["model"] for r in records)


@pytest.mark.parametrize("name", STEPS)
def test_every_form_of_a_maxtext_step_plans_to_the_same_bytes(name: str) -> None:
    record = _record(name)
    totals = {}
    whiles = record["tpu"]["post_partition_while_shapes"]
    for form in FORMS:
        prepared = _prepare(name, form, record)
        result = propagate(prepared)
        totals[form] = memory_report(prepared, result=result).total_bytes
        exact = propagation_agreement(prepared, result, whiles) == "exact"
        assert exact != (form in SHARDY_LOOPS_DIFFER.get(name, ())), form
    assert len(set(totals.values())) == 1, totals


def test_a_refusal_quotes_the_hbm_total_of_xla_tpus_buffer_assignment() -> None:
    """The bytes XLA:TPU's out-of-memory error quotes, "HLO temporaries" in today's wording, are its memory-usage
    report's HBM total, parameters included: the same measure as a compiled step's `hbm_bytes`."""
    import gzip

    from fidelity.memory_stats import report_hbm_bytes

    refused = [n for n in STEPS if "oom" in _record(n)["tpu"]]
    assert refused
    for name in refused:
        report = gzip.decompress((FIXTURES / f"{name}.memory-usage-report.txt.gz").read_bytes()).decode()
        needed = _record(name)["tpu"]["oom"]["needed_bytes"]
        # The message prints GiB to two decimals: within half of its last digit.
        total = report_hbm_bytes(report)
        assert total is not None and total == _record(name)["tpu"]["hbm_bytes"], name
        assert abs(needed - total) <= 0.005 * 2**30, name


# Today's worst error against XLA:TPU's HBM over these steps, as a regression bound (the goal is 5%): Gemma 2 2B
# on v5e-8, -10.7%. Every step's While shapes equal XLA:TPU's in its HLO form, the one sized here.
WORST_ERROR = 0.108


@pytest.mark.parametrize("name", STEPS)
def test_a_maxtext_steps_bytes_and_verdict_against_xla_tpu(name: str) -> None:
    record = _record(name)
    chip = _chip(record)
    prepared = _prepare(name, "hlo.gz", record)
    result = propagate(prepared)
    report = memory_report(prepared, result=result)
    xla, compiled = reference_bytes(record)
    ours = report.total_bytes
    assert propagation_agreement(prepared, result, record["tpu"]["post_partition_while_shapes"]) == "exact"
    assert abs(ours - xla) / xla <= WORST_ERROR, (ours, xla)
    band = band_of("tpu", record["partitioner"], front_end_of(prepared.source))
    capacity = CHIPS[chip].hbm_bytes
    ours_call = call(report.total_bytes, capacity, band)
    if abs(xla - capacity) > VERDICT_MARGIN * capacity:
        # Only a step whose real need is within the verdict's margin of the chip may be too close to call.
        assert ours_call == (FITS if compiled else DOES_NOT_FIT), (ours_call, xla, capacity)
    assert ours_call != (DOES_NOT_FIT if compiled else FITS), (ours_call, compiled)


# Steps whose remat policy offloads activations to host memory: XLA:TPU's host allocation is recorded.
OFFLOADING = [n for n in STEPS if _record(n)["tpu"].get("memory", {}).get("host_temp_size_in_bytes")]


def test_the_grid_holds_an_offloading_step_at_full_layer_count() -> None:
    assert any(_record(n)["layers"] == 32 for n in OFFLOADING), OFFLOADING


@pytest.mark.parametrize("name", OFFLOADING)
def test_host_memory_is_what_xla_tpu_allocates_there_and_hbm_leaves_it_out(name: str) -> None:
    """Offloaded residuals are XLA:TPU's host memory (its buffer assignment's memory space 5), not HBM: as
    measured, Llama 3 8B at 32 layers with `minimal_offloaded`, 4,864 MiB per chip to the byte."""
    record = _record(name)
    prepared = _prepare(name, "hlo.gz", record)
    report = memory_report(prepared, result=propagate(prepared))
    xla_host = record["tpu"]["memory"]["host_temp_size_in_bytes"]
    assert abs(report.host_bytes - xla_host) <= 0.10 * xla_host, (report.host_bytes, xla_host)
    xla, _ = reference_bytes(record)
    assert report.total_bytes < xla + 0.5 * xla_host, "the offloaded bytes are counted in HBM"


@pytest.mark.parametrize("name", STEPS)
def test_a_maxtext_step_is_recognised_as_maxtexts_in_every_form_that_says_so(name: str) -> None:
    """The HLO forms name MaxText's source files; the Shardy StableHLO has MaxText's mesh. GSPMD's StableHLO,
    printed without locations, carries neither and is read as JAX's (its verdict band falls back to JAX's)."""
    record = _record(name)
    for form in FORMS:
        module = parse_hlo_file(FIXTURES / f"{name}.{form}")
        bare = form.startswith("stablehlo") and record["partitioner"] == "gspmd"
        assert (front_end_of(module) == MAXTEXT) != bare, form


@pytest.mark.parametrize(
    "path",
    [CORPUS / "jax" / "jax_llama_scan_L8_fsdp4_tp2.hlo",
     REPO / "tests" / "fixtures" / "jax_0_12" / "syntax_step_shardy.xla_dump.hlo",  # a FileNames table, a Shardy mesh
     CORPUS / "torch_xla" / "llama_scan_L8_fsdp4_tp2.hlo"],
)  # fmt: skip
def test_other_front_ends_steps_are_not_taken_for_maxtexts(path: Path) -> None:
    module = parse_hlo_file(path)
    assert front_end_of(module) == ("torch_xla" if "torch_xla" in path.parts else "jax")

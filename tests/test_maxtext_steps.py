"""MaxText's train steps, compiled for TPU topologies ahead of time by MaxText's own `train_compile`
(`python -m fidelity.run_maxtext`, MaxText 0.2.5): jax 0.12 and libtpu 0.0.50 here (reduced layer counts), and
under `libtpu_0_0_52/` today's grid, compiled by libtpu 0.0.52 (jax 0.12.1 for Shardy; jax 0.12.0.1, the last
that lowers for GSPMD, for GSPMD): full layer counts (Llama 3.1 405B at 126, Llama 3.1 70B and Llama 2 70B at 80,
Gemma 2 at 26 and 42, Llama 3 8B, Llama 2 7B, Mistral 7B, Qwen3 8B, Gemma 3 4B) beside reduced ones, remat
policies `minimal`, `save_qkv_proj`, `minimal_offloaded`, gradient accumulation, expert parallelism, both
partitioners; each record's `argv` is the command. Each is planned from all three forms a user has: XLA's dump of
the compile, `lowered.as_text(dialect="hlo")` and the StableHLO text, prepared as the libtpu that compiled it
(`prepare(..., libtpu=)`: its passes and memory rules).

What holds on every step: each form is read whole and planned for the step's chip, and the three forms give
the same bytes per chip (they are one step). Our per-device While shapes equal XLA:TPU's on every step and form
but those `LOOPS_DIFFER` lists (which must still differ). Our bytes per chip stay within today's worst error against
XLA:TPU's HBM (its buffer assignment's total, `fidelity.memory_stats`: what it allocated, or for a step it
refuses, what its out-of-memory error says the step needed, the same total before its heap is packed), and as
many of today's libtpu's steps as measured are within 5% (the goals, 10% on every step and 5% on 90%, are not
met yet: bench/RESULTS.md says where); the verdict, with the band drawn from the steps most like it, is never the opposite of
XLA:TPU's, and "too close to call" only where XLA:TPU's need is within 10% of the chip. The table is in
bench/RESULTS.md (`python bench/maxtext_steps.py`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CORPUS, REPO

from fidelity.memory_stats import compared_bytes, reference_bytes
from fidelity.sweep import propagation_agreement
from planner import parse_hlo_file
from planner.hlo.structure.frontend import MAXTEXT, front_end_of
from planner.memory import CHIPS, memory_report
from planner.memory.report import MemoryReport
from planner.plan.similar_steps import StepTraits
from planner.plan.verdict import DOES_NOT_FIT, FITS, band_of, call
from planner.prepare import PreparedModule, prepare
from planner.propagation import propagate

FIXTURES = REPO / "tests" / "fixtures" / "maxtext"
FORMS = ("xla_dump.hlo.gz", "hlo.gz", "stablehlo.mlir.gz")
# Each step by its path under FIXTURES, without the suffix: `libtpu_0_0_52/maxtext_llama3-8b_L4_v6e-8_shardy`.
STEPS = sorted(str(p.relative_to(FIXTURES)).removesuffix(".xla.json") for p in FIXTURES.glob("**/*.xla.json"))

# Steps (and forms) whose While shapes still differ from XLA:TPU's, with what differs.
LOOPS_DIFFER: dict[str, tuple[str, ...]] = {
    # The dump's forward scan carries two splash-attention masks more (the dump elides their literals,
    # so CSE cannot merge them with their twins as XLA:TPU's does).
    "maxtext_gemma2-2b_L4_v5e-8_shardy": ("xla_dump.hlo.gz",),
    "libtpu_0_0_52/maxtext_gemma2-2b_L4_v5e-8_shardy": ("xla_dump.hlo.gz",),
    # Expert parallelism 4: the forward scan carries 157 elements where XLA:TPU's carries 149 (eight loop
    # invariants it merges or drops that the model keeps); the other 20 loops are equal.
    "libtpu_0_0_52/maxtext_mixtral-8x7b_L4_v5p-16_ep4_shardy": FORMS,
    # libtpu 0.0.52 on DeepSeek-V2 (equal under libtpu 0.0.50): its dense and MoE layer scans carry two elements
    # fewer than ours (22 and 136 against 24 and 138).
    "libtpu_0_0_52/maxtext_deepseek2-16b_L2_v6e-16_shardy": FORMS,
    "libtpu_0_0_52/maxtext_deepseek2-16b_L2_v6e-16_gspmd": FORMS,
    "libtpu_0_0_52/maxtext_deepseek2-16b_L2_v5p-16_shardy": FORMS,
    # Mixtral under GSPMD, libtpu 0.0.52: XLA:TPU's module keeps five of the eight searchsorted loops the Shardy
    # compile keeps, and its forward scan carries one element fewer.
    "libtpu_0_0_52/maxtext_mixtral-8x7b_L2_v5p-8_gspmd": FORMS,
    # The dumps elide the splash-attention masks' literals, as for Gemma 2 above.
    "libtpu_0_0_52/maxtext_gemma2-2b_L26_v5e-8_shardy": ("xla_dump.hlo.gz",),
    "libtpu_0_0_52/maxtext_gemma2-2b_L26_v5e-8_gspmd": ("xla_dump.hlo.gz",),
    "libtpu_0_0_52/maxtext_gemma2-9b_L42_v6e-16_shardy": ("xla_dump.hlo.gz",),
    "libtpu_0_0_52/maxtext_gemma3-4b_L34_v6e-8_gspmd": ("xla_dump.hlo.gz",),
}


def _record(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.xla.json").read_text())


def _prepare(name: str, form: str, record: dict) -> PreparedModule:
    """The step's form, prepared as the libtpu that compiled it."""
    return prepare(parse_hlo_file(FIXTURES / f"{name}.{form}"), _chip(record), libtpu=record["libtpu"])


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
        assert exact != (form in LOOPS_DIFFER.get(name, ())), form
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
        # The message prints GiB to two decimals: within half of its last digit. libtpu 0.0.52 leaves out the
        # thread-local allocations SparseCore's gathers hold beside the heap (Mixtral 8x7B at 16 layers: 580 MiB).
        total = report_hbm_bytes(report)
        assert total is not None and total == _record(name)["tpu"]["hbm_bytes"], name
        heap = _record(name)["tpu"].get("heap", {})
        thread_local = sum(a["bytes"] for a in heap.get("thread_local", ()))
        assert abs(needed - (total - thread_local)) <= 0.005 * 2**30, name


# None of the 61 steps is more than 10% from XLA:TPU's HBM (the goal). The worst, Gemma 2 2B at 26 layers on v5e-8,
# is 9.4% low: two windowed-einsum accumulators of its logits live at XLA:TPU's peak where the model holds one.
WORST_ERROR = 0.10


def _planned(name: str) -> tuple[dict, PreparedModule, MemoryReport, object]:
    record = _record(name)
    prepared = _prepare(name, "hlo.gz", record)
    result = propagate(prepared)
    return record, prepared, memory_report(prepared, result=result), result


@pytest.mark.parametrize("name", STEPS)
def test_a_maxtext_steps_bytes_and_verdict_against_xla_tpu(name: str) -> None:
    record, prepared, report, result = _planned(name)
    chip = _chip(record)
    xla, compiled = reference_bytes(record)
    ours = compared_bytes(report, compiled)
    exact = propagation_agreement(prepared, result, record["tpu"]["post_partition_while_shapes"]) == "exact"
    assert exact != ("hlo.gz" in LOOPS_DIFFER.get(name, ()))
    assert abs(ours - xla) / xla <= WORST_ERROR, (ours, xla)
    traits = StepTraits(record["libtpu"], record["partitioner"], chip, report.total_bytes)
    band = band_of("tpu", record["partitioner"], front_end_of(prepared.source), traits)
    capacity = CHIPS[chip].hbm_bytes
    ours_call = call(report.total_bytes, capacity, band)
    if abs(xla - capacity) >= 0.10 * capacity:
        # Only a step whose real need is within 10% of the chip may be too close to call.
        assert ours_call == (FITS if compiled else DOES_NOT_FIT), (ours_call, xla, capacity)
    assert ours_call != (DOES_NOT_FIT if compiled else FITS), (ours_call, compiled)


TODAYS_LIBTPU = "libtpu_0_0_52"


def test_todays_libtpu_grid_has_full_size_offloaded_and_both_partitioners_steps() -> None:
    records = [_record(n) for n in STEPS if n.startswith(TODAYS_LIBTPU)]
    assert len(records) >= 30
    assert {r["partitioner"] for r in records} == {"gspmd", "shardy"}
    assert any(r["model"] == "llama3.1-405b" and r["layers"] == 126 for r in records)
    assert any("offloaded" in " ".join(r["overrides"]) for r in records)


# Today's libtpu steps within 5% of XLA:TPU's HBM, as measured (35 of 43): a regression bound. The goal is 90%.
WITHIN_5_PERCENT = 35


def test_todays_libtpu_steps_within_5_percent_of_xla_tpu_stay_as_many_as_measured() -> None:
    errors = {}
    for name in (n for n in STEPS if n.startswith(TODAYS_LIBTPU)):
        record, _, report, _ = _planned(name)
        xla, compiled = reference_bytes(record)
        errors[name] = abs(compared_bytes(report, compiled) - xla) / xla
    within = [n for n, e in errors.items() if e <= 0.05]
    assert len(within) >= WITHIN_5_PERCENT, sorted((round(e, 3), n) for n, e in errors.items() if e > 0.05)


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

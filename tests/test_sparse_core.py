"""SparseCore's gathers: from libtpu 0.0.52, XLA:TPU holds each offloaded gather's table three times outside its
heap, for the whole step (`planner.memory.sparse_core`), on chips with SparseCores; and the libtpu a user names
(`--libtpu`, `prepare(..., libtpu=)`) picks the rules a step is sized by."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO

from planner import parse_hlo, parse_hlo_file
from planner.memory import memory_report, memory_timeline
from planner.memory.model import estimate_module
from planner.memory.sparse_core import offloaded_gathers
from planner.prepare import prepare
from planner.propagation import propagate

FIXTURES = REPO / "tests" / "fixtures" / "maxtext" / "libtpu_0_0_52"
# MaxText's Llama 3 8B (v6e-8, fsdp 8) at 32 layers, GSPMD, compiled by libtpu 0.0.52 (`fidelity.run_maxtext`).
LLAMA = "maxtext_llama3-8b_L32_v6e-8_gspmd"

EMBEDDING = """HloModule m, num_partitions=8
ENTRY e {
  table = bf16[32768,2048] parameter(0), sharding={devices=[1,8]<=[8]}
  ids = s32[64] parameter(1), sharding={replicated}
  ROOT rows = bf16[64,2048] gather(table, ids), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,2048}, sharding={devices=[1,8]<=[8]}
}
"""


def _sparse_core_bytes(text: str, chip: str, libtpu: str) -> int:
    """The bytes the memory model holds for SparseCore's tables (small steps fit the chip's on-chip memory, so the
    total would not show them)."""
    prepared = prepare(parse_hlo(text), chip, libtpu=libtpu)
    estimate = estimate_module(prepared.module, propagate(prepared), prepared.mesh, prepared.target)
    return sum(b.size_bytes for b in estimate.buffers if "SparseCore" in b.defined_by)


def test_a_row_gather_holds_three_tables_its_indices_and_its_rows_from_libtpu_0_0_52_on_v5p() -> None:
    table, ids, rows = 32768 * 256 * 2, 64 * 4, 64 * 256 * 2  # per device: the table and the rows split 8 ways
    assert _sparse_core_bytes(EMBEDDING, "v5p", "0.0.52") == 3 * (table + ids) + rows


def test_v6e_gathers_a_table_of_32_mib_or_less_on_its_tensor_core_and_v5p_on_its_sparse_cores() -> None:
    """Mixtral's 31.25 MiB embedding table on v6e-8 holds no thread-local copy; on v5p its 16 MiB expert-routing
    tables do."""
    small = EMBEDDING  # a 16 MiB table per device
    assert _sparse_core_bytes(small, "v6e", "0.0.52") == 0
    assert _sparse_core_bytes(small, "v5p", "0.0.52") > 0
    large = small.replace("bf16[32768,2048]", "bf16[65536,2048]")  # 32 MiB per device: still not on v6e
    assert _sparse_core_bytes(large, "v6e", "0.0.52") == 0
    larger = small.replace("bf16[32768,2048]", "bf16[65600,2048]")
    assert _sparse_core_bytes(larger, "v6e", "0.0.52") == 3 * (65600 * 256 * 2 + 64 * 4) + 64 * 256 * 2


def test_v5e_has_no_sparse_core_and_older_libtpu_no_thread_local_tables() -> None:
    assert _sparse_core_bytes(EMBEDDING, "v5e", "0.0.52") == 0
    assert _sparse_core_bytes(EMBEDDING, "v5p", "0.0.50.1") == 0
    assert _sparse_core_bytes(EMBEDDING, "v5p", "0.0.20") == 0


def test_a_gather_of_parts_of_rows_is_not_offloaded() -> None:
    partial = EMBEDDING.replace("slice_sizes={1,2048}", "slice_sizes={1,1024}").replace(
        "bf16[64,2048] gather", "bf16[64,1024] gather"
    )
    prepared = prepare(parse_hlo(partial), "v5p", libtpu="0.0.52")
    assert offloaded_gathers(prepared.module, propagate(prepared)) == []


def _steps_with_thread_local_allocations() -> list[str]:
    """libtpu 0.0.52's MaxText steps whose record keeps XLA:TPU's thread-local allocations (1 MiB and more)."""
    found = []
    for path in sorted(FIXTURES.glob("*.xla.json")):
        heap = json.loads(path.read_text())["tpu"].get("heap") or {}
        if "thread_local" in heap:
            found.append(path.name.removesuffix(".xla.json"))
    return found


def test_the_steps_that_record_thread_local_allocations_are_all_checked() -> None:
    """33 of today's libtpu's 40 compiled steps (a refused step has no buffer assignment; the other 7 were recorded
    before the runner kept them): the check below runs on each, and an empty list would skip it silently."""
    assert len(_steps_with_thread_local_allocations()) == 33


@pytest.mark.parametrize("name", _steps_with_thread_local_allocations())
def test_the_tables_are_the_thread_local_allocations_xla_tpu_made(name: str) -> None:
    """What XLA:TPU's buffer assignment allocated thread-local (1 MiB and more) on each of libtpu 0.0.52's MaxText
    steps, to the byte: the tables' copies and the rows in their tiled layout (Gemma 3 4B's 320 columns held as
    384), none for a table of 32 MiB or less on v6e or of 8 MiB or less on v5p, none for DeepSeek-V2's complex
    rotary table. The model's bytes add the indices' copies, which the record leaves out (under 1 MiB)."""
    record = json.loads((FIXTURES / f"{name}.xla.json").read_text())
    xla = sum(a["bytes"] for a in record["tpu"]["heap"]["thread_local"])
    chip = record["topology"].split("-")[0]
    prepared = prepare(parse_hlo_file(FIXTURES / f"{name}.hlo.gz"), chip, libtpu=record["libtpu"])
    copies = prepared.target.sparse_core_table_copies
    gathers = offloaded_gathers(prepared.module, propagate(prepared), prepared.target.sparse_core_min_table_bytes)
    ours = sum(g.thread_local_bytes(copies) - copies * g.indices_bytes for g in gathers) if copies else 0
    assert ours == xla


def test_a_table_is_held_in_tiles_of_8_rows_and_128_columns() -> None:
    """A bf16[32768,2400] table split 8 ways holds bf16[32768,300] per device, laid out as bf16[32768,384]."""
    odd = EMBEDDING.replace(",2048]", ",2400]").replace("slice_sizes={1,2048}", "slice_sizes={1,2400}")
    table, ids, rows = 32768 * 384 * 2, 64 * 4, 64 * 384 * 2
    assert _sparse_core_bytes(odd, "v5p", "0.0.52") == 3 * (table + ids) + rows


def test_a_complex_table_stays_on_the_tensor_core() -> None:
    complex_table = EMBEDDING.replace("bf16[32768,2048] parameter", "c64[32768,2048] parameter").replace(
        "bf16[64,2048] gather", "c64[64,2048] gather"
    )
    assert _sparse_core_bytes(complex_table, "v5p", "0.0.52") == 0


def test_v5p_leaves_a_table_of_8_mib_or_less_on_its_tensor_core() -> None:
    """The model's floor on v5p, 8 MiB, a round number between Llama 2 70B's embedding on v5p-128 (7.8 MiB per
    device), which holds no thread-local copy, and Mixtral's 16 MiB routing tables on v5p-8, which do (both steps
    are checked against XLA:TPU's allocations above)."""
    at_8_mib = EMBEDDING.replace("bf16[32768,2048]", "bf16[16384,2048]")  # 8 MiB per device
    assert _sparse_core_bytes(at_8_mib, "v5p", "0.0.52") == 0
    above = EMBEDDING.replace("bf16[32768,2048]", "bf16[16400,2048]")
    assert _sparse_core_bytes(above, "v5p", "0.0.52") > 0


def test_the_command_line_takes_the_libtpu_release_and_refuses_a_malformed_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    step = tmp_path / "embedding.hlo"
    step.write_text(EMBEDDING.replace("bf16[32768,2048]", "bf16[262144,2048]"))  # 128 MiB per device
    totals = {}
    for release in ("0.0.50.1", "0.0.52"):
        out = subprocess.run([sys.executable, "-m", "planner", "memory", str(step), "--chip", "v6e", "--libtpu",
                              release, "--json"], capture_output=True, text=True, timeout=120)  # fmt: skip
        assert out.returncode == 0, out.stderr
        totals[release] = json.loads(out.stdout)["total_bytes"]
    assert totals["0.0.52"] > totals["0.0.50.1"]
    bad = subprocess.run([sys.executable, "-m", "planner", "memory", str(step), "--libtpu", "latest"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "'latest' is not a libtpu release" in bad.stderr


def test_the_timeline_holds_a_sparse_core_table_to_the_step_s_end() -> None:
    """The tables are held from the first position through the last (`end` is one past it): the entry's timeline
    (what a plan draws) reads them at every position and peaks at the report's total."""
    prepared = prepare(parse_hlo(EMBEDDING), "v5p", libtpu="0.0.52")
    result = propagate(prepared)
    report = memory_report(prepared, result=result)
    (entry, *_) = memory_timeline(prepared, result)
    assert _sparse_core_bytes(EMBEDDING, "v5p", "0.0.52") > 0
    assert entry.live_bytes == [report.total_bytes] * len(entry.positions)

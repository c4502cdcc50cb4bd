"""Predicted bytes per device against XLA's buffer assignment of the same step (CPU backend)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CORPUS

from planner import parse_hlo_file
from planner.memory import memory_report
from planner.prepare import prepare

# The prediction's total must stay within this of XLA's on every file.
TOTAL_TOLERANCE = 0.10


def xla_numbers(path: Path) -> dict[str, int]:
    data = json.loads(path.read_text())
    if "memory" in data:  # JAX: compiled memory stats
        m = data["memory"]
        return {"argument": m["argument_size_in_bytes"], "output": m["output_size_in_bytes"], "total": m["total_bytes"]}
    kinds = data["xla_allocation_bytes_by_kind"]  # torch_xla: CPU buffer assignment
    return {
        "argument": kinds["parameter"],
        "output": kinds["maybe-live-out"] + kinds["output"],
        "total": data["xla_per_device_total_bytes"],
    }


CASES = sorted(CORPUS.glob("torch_xla/*.truth.json")) + sorted(CORPUS.glob("jax/*.xla.json"))


def hlo_for(path: Path) -> Path:
    return path.with_name(path.name.split(".")[0] + ".hlo")


def predicted(path: Path) -> dict[str, int]:
    report = memory_report(prepare(parse_hlo_file(hlo_for(path))))
    return {"argument": report.argument_bytes, "output": report.output_bytes, "total": report.total_bytes}


@pytest.mark.parametrize("truth", CASES, ids=[p.name.split(".")[0] for p in CASES])
def test_bytes_per_device_match_xla(truth: Path) -> None:
    ours, xla = predicted(truth), xla_numbers(truth)
    # Arguments and outputs are exact: they are the per-device shapes of the entry's parameters and results.
    assert ours["argument"] == xla["argument"]
    assert ours["output"] == xla["output"]
    error = (ours["total"] - xla["total"]) / xla["total"]
    assert abs(error) <= TOTAL_TOLERANCE, f"total {ours['total']:,} vs XLA {xla['total']:,} ({error:+.1%})"


PAIRS = [
    ("torch_xla/llama_scan_L8_fsdp4_tp2", "torch_xla/llama_scan_L8_fsdp4_tp2_fixed", ".truth.json"),
    ("jax/jax_llama_scan_L8_fsdp4_tp2", "jax/jax_llama_scan_L8_fsdp4_tp2_pinned", ".xla.json"),
]


@pytest.mark.parametrize("base,fixed,suffix", PAIRS, ids=["torch_xla_fixed", "jax_pinned"])
def test_fix_moves_memory_like_xla(base: str, fixed: str, suffix: str) -> None:
    ours = predicted(CORPUS / f"{fixed}{suffix}")["total"] - predicted(CORPUS / f"{base}{suffix}")["total"]
    xla = xla_numbers(CORPUS / f"{fixed}{suffix}")["total"] - xla_numbers(CORPUS / f"{base}{suffix}")["total"]
    assert ours < 0 and xla < 0
    # Measured: torch_xla 1.23, JAX 1.06 (our saving over XLA's). The torch_xla pair's ratio is the base
    # step's over-prediction (+4.2%); the fixed step is within 0.5% of XLA since its pins are read as the
    # views XLA's sharding remover makes them (before: +1.7%, ratio 1.17).
    assert 0.95 <= ours / xla <= 1.25, f"ours {ours:,} vs XLA {xla:,}"

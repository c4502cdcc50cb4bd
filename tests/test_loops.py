"""While loops: trip counts read off the loop match the layer count the step was built with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CORPUS

from planner import parse_hlo_file, while_loops


def _scan_cases() -> list[tuple[Path, int]]:
    cases = []
    for truth in sorted(CORPUS.glob("torch_xla/*.truth.json")):
        config = json.loads(truth.read_text())["config"]
        if config["mode"] == "scan":
            cases.append((truth.with_name(truth.name.replace(".truth.json", ".hlo")), int(config["L"])))
    for info in sorted(CORPUS.glob("jax/*.xla.json")):
        cases.append(
            (info.with_name(info.name.replace(".xla.json", ".hlo")), int(json.loads(info.read_text())["config"]["L"]))
        )
    return cases


SCANS = _scan_cases()


@pytest.mark.parametrize("path,layers", SCANS, ids=[p.name for p, _ in SCANS])
def test_scan_loops_run_once_per_layer(path: Path, layers: int) -> None:
    loops = while_loops(parse_hlo_file(path))
    assert len(loops) == 2  # forward scan and backward scan
    assert [loop.trip_count for loop in loops] == [layers, layers]
    assert all(loop.trip_count_source == "loop structure" for loop in loops)


def test_plain_loop_step_has_no_while() -> None:
    path = CORPUS / "torch_xla" / "llama_loop_L4_fsdp4_tp2.hlo"
    assert while_loops(parse_hlo_file(path)) == ()


def test_backend_config_trip_count_wins() -> None:
    from planner import parse_hlo

    text = """HloModule m

cond {
  p = (s32[]) parameter(0)
  ROOT t = pred[] constant(true)
}

body {
  ROOT p = (s32[]) parameter(0)
}

ENTRY e {
  i = (s32[]) parameter(0)
  ROOT w = (s32[]) while(i), condition=cond, body=body, backend_config={"known_trip_count":{"n":"5"}}
}
"""
    (loop,) = while_loops(parse_hlo(text))
    assert (loop.trip_count, loop.trip_count_source) == (5, "backend_config")

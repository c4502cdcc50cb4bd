"""Golden files: each `tests/golden/NAME.hlo` beside `NAME.expected.json`, the entry's shardings after propagation.

The expectations are XLA's own: `test_golden_matches_xla` runs XLA's SPMD
pipeline (jaxlib, through `shared/tools/xla_oracle.py`) on every input and
compares its post-propagation shardings with the file, instruction by
instruction (matched by `op_name`, which XLA's import keeps, and opcode).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SHARED

from planner import parse_hlo, parse_hlo_file, parse_sharding
from planner.memory import memory_report
from planner.prepare import prepare
from planner.propagation import PropagationOptions, propagate

GOLDEN = sorted((Path(__file__).parent / "golden").glob("*.hlo"))
# Outputs may take propagated shardings, as jax.jit's do; parameters keep theirs.
OPTIONS = PropagationOptions(is_spmd=True, allow_to_output=(True,))
UNMATCHED = {"opt_barrier_backward": 4, "opt_barrier_forward": 4}


def expected(path: Path) -> dict[str, str | None]:
    return json.loads(path.with_suffix(".expected.json").read_text())


def ours(path: Path) -> dict[str, str | None]:
    module = parse_hlo_file(path)
    result = propagate(prepare(module, options=OPTIONS))
    return {
        i.name: i.sharding.to_text() if i.sharding is not None else None
        for i in result.instructions
        if i.computation == module.entry_name
    }


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden_propagation(path: Path) -> None:
    assert ours(path) == expected(path)
    # Sizing the result must work too (an operand's sharding must fit its shape).
    assert memory_report(prepare(parse_hlo_file(path))).total_bytes > 0


@pytest.mark.xla
@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden_matches_xla(path: Path, tmp_path: Path) -> None:
    module = parse_hlo_file(path)
    leaves = [
        leaf
        for c in module.computations
        for i in c.instructions
        if i.sharding is not None
        for leaf in (i.sharding.elements if i.sharding.is_tuple else (i.sharding,))
    ]
    devices = max((s.tile_assignment.num_devices for s in leaves if s.tile_assignment is not None), default=1)
    subprocess.run(
        [sys.executable, str(SHARED / "tools" / "xla_oracle.py"), str(path), str(devices), "--dump", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (after,) = tmp_path.glob("*after_sharding-propagation*.txt")
    xla = parse_hlo(after.read_text())
    by_name: dict[tuple[str, str], list[str | None]] = {}
    for inst in xla.entry.instructions:
        op_name = inst.metadata.get("op_name") if inst.metadata is not None else None
        if op_name is not None:
            sharding = inst.sharding.to_text() if inst.sharding is not None else None
            by_name.setdefault((op_name, inst.opcode), []).append(sharding)
    compared = 0
    for inst in module.entry.instructions:
        found = by_name.get((inst.name, inst.opcode), [])
        if len(found) != 1:
            continue
        want = expected(path)[inst.name]
        got = found[0]
        assert (want is None) == (got is None), (inst.name, want, got)
        if want is not None and got is not None:
            assert parse_sharding(want) == parse_sharding(got), (inst.name, want, got)
        compared += 1
    # Every entry instruction but those XLA's import leaves without an op_name to match by: the tuple
    # around an opt-barrier and the get-tuple-elements out of it (`t`, `x`, `y`, `r`).
    assert compared == len(module.entry.instructions) - UNMATCHED.get(path.stem, 0)

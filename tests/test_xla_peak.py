"""XLA:TPU's own peak read from its dumps (`fidelity.xla_peak`), checked against what the dumps say of themselves.

The dumps are XLA:TPU's live ranges and buffer assignment of MaxText's Llama 3 8B step on a v6e-8
(`fidelity.run_maxtext --keep-dumps`, the step of `maxtext_llama3-8b_L4_v6e-8_shardy.xla.json`). The
live-range file lists the values live at its peak with their unpadded sizes; the buffer assignment
gives each value its allocation, memory space and padded size. Read together they must name the same
values at the peak, and the HBM the buffer assignment allocates is the record's.
"""

from __future__ import annotations

import gzip
import json
import re

import pytest
from conftest import REPO

from fidelity.xla_peak import main, read_peak

FIXTURES = REPO / "tests" / "fixtures" / "maxtext"
STEP = "maxtext_llama3-8b_L4_v6e-8_shardy"


def _text(kind: str) -> str:
    return gzip.decompress((FIXTURES / f"{STEP}.{kind}.txt.gz").read_bytes()).decode()


@pytest.fixture(scope="module")
def texts() -> tuple[str, str]:
    return _text("live-range"), _text("buffer-assignment")


def test_the_values_at_the_peak_are_the_ones_xla_lists_there(texts: tuple[str, str]) -> None:
    live_range, assignment = texts
    peak = read_peak(live_range, assignment)
    listing = live_range[live_range.index("(peak):") : live_range.index("Stack trace breakdown")]
    listed = {name + (index if index != "{}" else ""): int(size)
              for name, index, size in re.findall(r"^    (\S+?)(\{[^}]*\}): (\d+) bytes", listing, re.M)}  # fmt: skip
    ours = {name: size for values in peak.live.values() for size, name in values}
    assert ours.keys() == listed.keys()
    # The buffer assignment's sizes are the padded ones of the TPU layouts: never less than the listing's.
    # A tuple's size is its table of pointers, which each file sizes by its own pointer width.
    tuples = set(re.findall(r"^ value: <\d+ (\S+?)(?:\{\})?(?: \(phi\))? @\d+> \([^)]*\): \(", assignment, re.M))
    assert all(ours[name] >= listed[name] for name in listed if name not in tuples)
    assert peak.instruction is not None and re.search(
        rf"^    {peak.position}:{re.escape(peak.instruction)}$", live_range, re.M
    )


def test_hbm_is_the_records_and_the_heap_holds_its_live_values(texts: tuple[str, str]) -> None:
    peak = read_peak(*texts)
    record = json.loads((FIXTURES / f"{STEP}.xla.json").read_text())
    assert peak.hbm_allocated_bytes == record["tpu"]["hbm_bytes"]
    # The heap is one allocation inside the HBM total; what its values cover at once cannot exceed it.
    assert 0 < peak.heap_live_peak_bytes <= peak.heap_bytes < peak.hbm_allocated_bytes
    # At the peak, HBM (memory space 0) holds the gathered weights; VMEM (1) a little beside them.
    assert peak.bytes_in(0) > 100 * peak.bytes_in(1) > 0


def test_a_live_range_dump_without_its_peak_is_refused_clearly(tmp_path, capsys) -> None:
    with pytest.raises(ValueError, match="names no peak"):
        read_peak("HloLiveRange (max 3):\n  InstructionSequence:\n    0:p\n", "")
    assert main([str(tmp_path)]) == 2
    assert "no *after_optimizations-live-range.txt" in capsys.readouterr().err

"""One sweep table over two stacks: rows saved by one environment's sweep, read beside another's."""

from __future__ import annotations

from pathlib import Path

import pytest

from fidelity.cases import CI_SUBSET
from fidelity.stack_rows import load_rows, save_rows, stack_name
from fidelity.sweep import Row, render

JAX_CASE = next(c for c in CI_SUBSET if c.front_end == "jax" and c.chip is not None)
TORCH_CASE = next(c for c in CI_SUBSET if c.front_end == "torch_xla")
MIB = 2**20


def _line(table: str, case_name: str) -> list[str]:
    line = next(x for x in table.splitlines() if x.startswith(f"| {case_name} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_rows_come_back_with_the_stack_that_measured_them(tmp_path: Path) -> None:
    rows = [Row(JAX_CASE, "cpu", 100 * MIB, 110 * MIB), Row(TORCH_CASE, "cpu", 50 * MIB, 49 * MIB)]
    save_rows(tmp_path / "rows.pkl", rows)
    saved = load_rows(tmp_path / "rows.pkl")
    assert saved.stack == stack_name() and saved.rows == tuple(rows)
    assert saved.by_case()[(JAX_CASE.name, "cpu")].ours_bytes == 110 * MIB


def test_the_other_stacks_bytes_stand_beside_each_case_both_measured(tmp_path: Path) -> None:
    pinned = [Row(JAX_CASE, "cpu", 100 * MIB, 110 * MIB), Row(JAX_CASE, JAX_CASE.chip, 40 * MIB, 30 * MIB),
              Row(TORCH_CASE, "cpu", 50 * MIB, 49 * MIB)]  # fmt: skip
    save_rows(tmp_path / "pinned.pkl", pinned)
    beside = load_rows(tmp_path / "pinned.pkl")
    today = [Row(JAX_CASE, "cpu", 80 * MIB, 88 * MIB), Row(JAX_CASE, JAX_CASE.chip, 60 * MIB, 66 * MIB)]
    table = render(today + [r for r in beside.rows if r.case.front_end == "torch_xla"], beside)
    header = table.splitlines()[0]
    assert header.endswith(f"| XLA:CPU MiB on {beside.stack} | XLA:TPU MiB on {beside.stack} |")
    jax = _line(table, JAX_CASE.name)
    assert jax[6:9] == ["80.0", "88.0", "+10.0%"]  # today's compiler and ours
    assert jax[-2:] == ["100.0 (+10.0%)", "40.0 (-25.0%)"]  # the other stack's compilers, ours there
    torch = _line(table, TORCH_CASE.name)
    assert torch[6:9] == ["50.0", "49.0", "-2.0%"] and torch[-2:] == ["(the row itself)", "(the row itself)"]


def test_a_file_that_is_not_saved_rows_is_refused_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "rows.pkl"
    path.write_text("| case | step |\n")
    with pytest.raises(ValueError, match=r"rows\.pkl: not rows a sweep of this checkout saved .*--save-rows"):
        load_rows(path)

"""Every module the references hold plans: the corpus dumps (as compiled, as they enter the pass, as captured)
and every module of XLA's own propagation tests. No input of theirs may end in anything but a plan."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import corpus_hlo_files, xla_cases

from planner import parse_hlo, parse_hlo_file
from planner.plan.planner import make_plan
from planner.prepare import prepare

CORPUS_FILES = corpus_hlo_files()


@pytest.mark.parametrize("path", CORPUS_FILES, ids=[p.name for p in CORPUS_FILES])
def test_corpus_module_plans(path: Path) -> None:
    plan, patched = make_plan(prepare(parse_hlo_file(path)))
    assert plan.hbm.total_before > 0
    assert patched.entry_name


def test_every_xla_test_module_plans() -> None:
    planned = 0
    for case in xla_cases():
        plan, _ = make_plan(prepare(parse_hlo(case["hlo"])))
        # The smallest, RemoveCSEPrevention, holds 8 bytes.
        assert plan.hbm.total_before > 0, case["name"]
        planned += 1
    assert planned == len(xla_cases()) >= 150

"""The plan's JAX lines pasted into the grid's steps: XLA compiles each gradient to the sharding the line names,
and the bytes to what the plan's change set compiles to.

For each JAX gradient step of the CI subset whose plan recommends pins, the lines the plan gives the user
(`PlacementInfo.user.code`) are executed as written inside the step's layer function, or on its returned
gradients (`fidelity.applied_lines`), and the step is compiled by XLA:CPU. The check of its bytes is against
the compile of the plan's own HLO placements (`fidelity.placement_check`, as the sweep verifies a plan).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
from conftest import REPO

from fidelity.cases import CI_SUBSET, Case
from fidelity.placement_check import PlacementCheck, check_change_set
from fidelity.references import ensure_references, reference_path
from planner import parse_hlo_file
from planner.hlo.ir.module import HloModule
from planner.mesh import Mesh
from planner.plan.diagnosis.findings import GRADIENT_KINDS
from planner.plan.fixes.placements import PIN_OUTPUT
from planner.plan.model import Plan
from planner.plan.planner import make_plan
from planner.prepare import PreparedModule, prepare

pytestmark = pytest.mark.xla

CASES = [c for c in CI_SUBSET if c.front_end == "jax" and not c.optimizer]


@dataclass(frozen=True)
class Planned:
    case: Case
    module: HloModule
    prepared: PreparedModule
    plan: Plan
    patched: HloModule

    def change_set_compiled(self) -> PlacementCheck | None:
        """The plan's HLO change set compiled by XLA:CPU, as the sweep verifies it; None when it has none."""
        if not any(p.recommended for p in self.plan.placements):
            return None
        return check_change_set(self.module, self.prepared.written_front, self.patched, self.plan,
                                self.case.mesh.num_devices, None)  # fmt: skip


@pytest.fixture(scope="module")
def planned() -> dict[str, Planned]:
    """Each case planned for XLA:CPU over its own mesh."""
    assert not ensure_references(CASES, jobs=2)
    found = {}
    for case in CASES:
        mesh = Mesh(case.mesh.shape, case.mesh.axis_names, tuple(range(case.mesh.num_devices)))
        module = parse_hlo_file(reference_path(case))
        prepared = prepare(module, "cpu", mesh)
        plan, patched = make_plan(prepared)
        found[case.name] = Planned(case, module, prepared, plan, patched)
    return found


def _lines(plan: Plan) -> list[dict[str, str]]:
    return [
        {"code": p.user.code, "place": "gradient" if p.kind == PIN_OUTPUT else "layer"}
        for p in plan.placements
        if p.recommended and p.user is not None and p.user.code is not None
    ]


@pytest.fixture(scope="module")
def checked(planned: dict[str, Planned]) -> dict[str, tuple[Plan, PlacementCheck | None, dict]]:
    request = {"cases": [{"case": n, "lines": _lines(p.plan)} for n, p in planned.items() if _lines(p.plan)]}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_"))}
    done = subprocess.run([sys.executable, "-m", "fidelity.applied_lines"], input=json.dumps(request),
                          capture_output=True, text=True, timeout=1200, cwd=REPO, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    answers = {a["name"]: a for a in json.loads(done.stdout)["cases"]}
    return {n: (p.plan, p.change_set_compiled(), answers[n]) for n, p in planned.items() if n in answers}


def test_the_lines_are_checked_on_steps_of_every_kind(checked: dict) -> None:
    cases = [c for c in CASES if c.name in checked]
    # Both partitioners, remat and none, a 3-axis mesh, lines in the layer and on a returned gradient.
    assert {c.partitioner for c in cases} == {"gspmd", "shardy"}
    assert {c.remat for c in cases} >= {None, "full", "dots"}
    assert any(len(c.mesh.shape) == 3 for c in cases)
    assert {line["place"] for n in checked for line in _lines(checked[n][0])} == {"layer", "gradient"}
    assert len(cases) >= 6


def test_every_gradient_finding_on_the_grid_names_its_parameter(planned: dict[str, Planned]) -> None:
    """JAX writes each parameter's path into its entry parameter's metadata: every gradient a plan finds on a
    JAX step of the CI subset, scanned or returned, once or accumulated over microbatches, is named by it."""
    counted = 0
    for case in CASES:
        for finding in planned[case.name].plan.findings:
            if finding.kind in GRADIENT_KINDS:
                counted += 1
                assert finding.name is not None and finding.name.startswith("grad of params['"), (case.name, finding)
    # Every gradient finding of these plans today (a new or lost finding shows here first).
    assert counted == 34


def test_every_line_names_its_parameter_and_xla_gives_the_gradient_its_spec(checked: dict) -> None:
    for name, (plan, _, answer) in checked.items():
        pins = [p for p in plan.placements if p.recommended and p.user is not None]
        assert all(p.user.parameter is not None for p in pins), name
        assert answer["asked"], name
        # JAX's own equality: the compiled gradient's sharding against NamedSharding(mesh, P(None, *spec)).
        wrong = {k: (answer["after"][k], answer["asked"][k]) for k, ok in answer["equivalent"].items() if not ok}
        assert not wrong, (name, wrong)
    # The lines are what changes them: XLA left some of them otherwise on each step.
    for name, (_, _, answer) in checked.items():
        assert any(answer["before"][k] != answer["asked"][k] for k in answer["asked"]), name


def test_the_lines_compile_to_the_bytes_of_the_plan_s_change_set(checked: dict) -> None:
    for name, (_, check, answer) in checked.items():
        case = next(c for c in CASES if c.name == name)
        assert check is not None
        # The same step as XLA compiled it for the reference, to the byte.
        assert answer["total_bytes_before"] == check.xla_before, name
        after, pinned = answer["total_bytes_after"], check.xla_after
        assert after < answer["total_bytes_before"] or case.remat is None, name
        if case.remat is not None:
            # Inside the layer's jax.checkpoint the lines add nothing for the backward to keep: the change set's bytes.
            assert abs(after - pinned) <= 0.001 * pinned, (name, after, pinned)
        else:
            # Without remat JAX keeps each layer's pinned slice for the backward: at most one more copy of them.
            assert pinned <= after <= pinned + answer["pinned_layer_bytes"], (name, after, pinned)

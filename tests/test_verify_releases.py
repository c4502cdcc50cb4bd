"""`--verify` on a module another jax release lowered: verified where the installed jaxlib reads it, and
where it cannot, the plan printed and stored all the same with one line saying which release wrote the module,
which jaxlib is installed, and what to install.

The fixture is one real step, sorted inside its scan, lowered by each release (`fidelity.sorted_step`):
jax 0.12 writes its comparator `order=TOTAL`, which jaxlib 0.7.1's parser refuses. Run on both stacks
(`make test` and `make test-jax-today`): each asserts what its own jaxlib does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from fastapi.testclient import TestClient

from api import create_app
from api.job_runner import run_job
from api.job_store import JobStore
from api.settings import Settings
from api.store import PlanStore
from cli.plan_command import NOT_VERIFIED
from planner.hlo.text.jaxlib_api import jaxlib_version
from planner.plan.compilers.jax_releases import newest_sighting, unreadable_module
from planner.plan.compilers.verify import error_line
from planner.plan.model import Plan, VerifyNotRun

pytestmark = pytest.mark.xla

FIXTURES = REPO / "tests" / "fixtures"
NEWER = FIXTURES / "jax_0_12" / "sorted_step.lowered.hlo"
OLDER = FIXTURES / "jax_0_7_1" / "sorted_step.lowered.hlo"
MESH = ["--mesh", "fsdp=2,tp=4"]
# Whether the installed jaxlib reads what jax 0.12 writes.
READS_0_12 = jaxlib_version() >= (0, 12)
INSTALLED = ".".join(map(str, jaxlib_version()))
NOT_VERIFIED_LINE = (
    "  not verified: the module was written by jax 0.12 (`order=TOTAL` on lt_to.1), which the installed jaxlib "
    f"{INSTALLED} cannot read; to verify it, plan it in a Python 3.12 environment with jax 0.12: pip install "
    "'spmd-planner[jax]' 'jax==0.12.*'"
)


def plan(path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "planner", "plan", str(path), *MESH, "--verify", *options]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)


@pytest.mark.parametrize(
    ("fixture", "shown", "instruction"),
    [
        ("jax_0_12/sorted_step.lowered.hlo", "`order=TOTAL`", "lt_to.1"),
        ("jax_0_12/syntax_step_gspmd.lowered.hlo", "`is_stable` on a topk", "top_k.3"),
        ("jax_0_12/syntax_step_gspmd.xla_dump.hlo", "`is_stable` on a topk", "top_k.3"),
        ("jax_0_12/syntax_step_shardy.lowered.hlo", "`replica_groups=mesh[...]`", "psum_invariant.10"),
    ],
    ids=["sort", "topk", "topk_in_xla_dump", "shard_map_psum"],
)
def test_a_form_only_jax_0_12_writes_names_the_release(fixture: str, shown: str, instruction: str) -> None:
    sighting = newest_sighting((FIXTURES / fixture).read_text())
    assert sighting is not None
    assert (sighting.form.release.name, sighting.form.shown, sighting.instruction) == ("jax 0.12", shown, instruction)


@pytest.mark.parametrize("fixture", sorted(p.name for p in (FIXTURES / "jax_0_7_1").glob("*.hlo")))
def test_jax_0_7_1_text_shows_no_newer_release(fixture: str) -> None:
    assert newest_sighting((FIXTURES / "jax_0_7_1" / fixture).read_text()) is None


LT_TO = "  ROOT lt_to.1 = pred[] compare(select_n.5, select_n.7), direction=LT, order=TOTAL"
ELSEWHERE = "  x.1 = f32[] negate(y.1), bar=1"


@pytest.mark.parametrize(
    ("module", "refused_line", "jaxlib", "written_by", "says"),
    [
        (NEWER, LT_TO, "0.7.1", "jax 0.12", "written by jax 0.12 (`order=TOTAL` on lt_to.1)"),
        (NEWER, ELSEWHERE, "0.7.1", "jax 0.12", "written by jax 0.12 (`order=TOTAL` on lt_to.1)"),
        (OLDER, ELSEWHERE, "0.7.1", None, "cannot read the module (XLA's parser at x.1: unexpected attribute"),
        (NEWER, LT_TO, "0.12.0.1", None, "jaxlib 0.12.0.1 cannot read the module (XLA's parser at lt_to.1"),
    ],
    ids=["form_on_the_refused_line", "form_elsewhere", "no_form", "a_form_this_jaxlib_reads"],
)
def test_a_refusal_names_the_release_only_where_the_text_shows_one_newer_than_the_jaxlib(
    module: Path, refused_line: str, jaxlib: str, written_by: str | None, says: str
) -> None:
    refusal = unreadable_module(module.read_text(), 'unexpected attribute "bar"', refused_line, jaxlib)
    assert refusal.cause == "unreadable-module" and refusal.written_by == written_by and says in str(refusal)
    assert refusal.jaxlib == f"jaxlib {jaxlib}" and "\n" not in str(refusal)


def test_a_failed_compile_is_told_by_its_exception_line_without_the_quoted_text() -> None:
    stderr = (
        "Traceback (most recent call last):\n"
        '  File "xla_compile.py", line 9, in main\n'
        "jaxlib._jax.XlaRuntimeError: INVALID_ARGUMENT: Syntax error when trying to parse the text as a HloModule:\n"
        'was parsing 31:75: error: unexpected attribute "order".\n'
        f"{LT_TO}\n"
        "                                                                          ^\n"
    )
    assert error_line(stderr) == (
        "XlaRuntimeError: INVALID_ARGUMENT: Syntax error when trying to parse the text as a HloModule: "
        'was parsing 31:75: error: unexpected attribute "order".'
    )


def test_a_module_the_installed_jaxlib_cannot_read_still_gets_its_plan_and_one_line_why() -> None:
    done = plan(NEWER)
    if READS_0_12:
        assert done.returncode == 0, done.stderr
        assert f"verified with jaxlib {INSTALLED}" in done.stdout
        return
    assert done.returncode == NOT_VERIFIED, done.stderr
    lines = done.stdout.splitlines()
    # The whole plan, then the line: no traceback, no XLA error quoting the text with a caret under it.
    assert lines[0] == "plan for jit_step on mesh fsdp=2,tp=4" and "  placements: 1" in lines
    assert lines[-1] == NOT_VERIFIED_LINE
    assert sum("not verified" in line for line in lines) == 1
    for noise in ("Traceback", "XlaRuntimeError", "^^^", "could not compile"):
        assert noise not in done.stdout + done.stderr


def test_the_json_plan_carries_why_as_a_typed_value() -> None:
    done = plan(NEWER, "--json")
    answer = json.loads(done.stdout)
    if READS_0_12:
        assert done.returncode == 0 and answer["verify_not_run"] is None and answer["verification"] is not None
        return
    assert done.returncode == NOT_VERIFIED and answer["verification"] is None
    assert answer["verify_not_run"] == {
        "cause": "unreadable-module",
        "reason": NOT_VERIFIED_LINE.removeprefix("  not verified: "),
        "written_by": "jax 0.12",
        "jaxlib": f"jaxlib {INSTALLED}",
        "install": "pip install 'spmd-planner[jax]' 'jax==0.12.*'",
    }
    assert answer["verification_skipped"] == answer["verify_not_run"]["reason"]
    assert Plan.model_validate(answer).verify_not_run == VerifyNotRun.model_validate(answer["verify_not_run"])
    # A stored plan JSON that says why in `verification_skipped` alone reads as no faithful compile.
    alone = Plan.model_validate({**answer, "verify_not_run": None})
    assert alone.verify_not_run == VerifyNotRun(cause="no-faithful-compile", reason=answer["verification_skipped"])
    # JSON is for programs: a person at the terminal gets the line on stderr, once.
    assert done.stderr.splitlines()[-1] == f"spmd-planner: {NOT_VERIFIED_LINE.strip()}"


def test_the_same_step_lowered_by_jax_0_7_1_verifies_on_either_jaxlib() -> None:
    done = plan(OLDER)
    assert done.returncode == 0, done.stderr
    assert f"verified with jaxlib {INSTALLED}" in done.stdout and "not verified" not in done.stdout


def test_a_verify_job_keeps_its_plan_when_the_compiles_cannot_run(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path / 'plans.sqlite3'}"
    store = PlanStore(store_url)
    request = {"hlo": NEWER.read_text(), "mesh": {"shape": [2, 4], "axis_names": ["fsdp", "tp"]}}
    job = JobStore(store).create("verify", request, "anonymous", "gone")
    assert run_job(store_url, job.id, 1, heartbeat_seconds=0.2) == "done"
    c = TestClient(create_app(Settings(db=store_url)))
    record = c.get(f"/jobs/{job.id}").json()
    assert record["state"] == "done" and record["error"] is None and record["links"]["plan"]
    stored = c.get(record["links"]["plan"]).json()["plan"]
    page = c.get(record["links"]["view"]).text
    if READS_0_12:
        assert record["verify_not_run"] is None and stored["verification"] is not None
        assert "the verified plan" in page
        return
    # The job's record says the compiles did not run, and why; the plan it made is stored whole.
    assert record["verify_not_run"]["cause"] == "unreadable-module"
    assert record["verify_not_run"]["written_by"] == "jax 0.12"
    assert record["result"]["verify_not_run"] == record["verify_not_run"]
    assert stored["verification"] is None and stored["verify_not_run"] == record["verify_not_run"]
    assert stored["module"] == "jit_step" and len(stored["placements"]) == 1
    assert 'id="not-verified"' in page and "written by jax 0.12" in page
    store.close()

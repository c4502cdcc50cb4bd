"""StableHLO text (`lowered.as_text()`) read as the HLO module XLA compiles, with the compile's flags.

The fixture is JAX's own lowering of a small SGD step returning its params pinned, its gradients free
and its loss pinned to P(); its header comment records what XLA's dump of the compile showed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from fastapi.testclient import TestClient

from api import create_app
from api.settings import Settings
from planner import parse_hlo
from planner.errors import HloParseError
from planner.hlo.text.stablehlo_text import is_stablehlo_text, read_stablehlo
from planner.memory import memory_report
from planner.memory.donation import declared_aliases
from planner.prepare import prepare

FIXTURE = Path(__file__).parent / "fixtures" / "jax_sgd_mixed_outputs.stablehlo.mlir"
TEXT = FIXTURE.read_text()


def test_the_flags_are_those_xla_s_dump_of_the_compile_shows() -> None:
    module = parse_hlo(TEXT)
    assert module.name == "jit_step"
    # Params pinned, the free gradients of the sharded weight and of the replicated norm, the P() loss.
    assert module.attr("allow_spmd_sharding_propagation_to_output") == (False, False, True, True, False)
    assert module.attr("allow_spmd_sharding_propagation_to_parameters") == (False, False, False)
    assert module.attr("num_partitions") == 8
    assert set(declared_aliases(module)) == {(0,), (1,)}  # the donated params, kept by the converter


def test_the_module_is_planned_without_assumptions() -> None:
    prepared = prepare(parse_hlo(TEXT), "v6e")
    assert not prepared.warnings
    assert memory_report(prepared).total_bytes > 0


def test_hlo_text_is_not_taken_for_stablehlo() -> None:
    hlo = read_stablehlo(TEXT)
    assert hlo.startswith("HloModule jit_step") and not is_stablehlo_text(hlo)
    assert is_stablehlo_text(TEXT) and is_stablehlo_text('#loc1 = loc("x")\nmodule {}\n')


@pytest.mark.parametrize(
    "text,line,column,message",
    [
        ("module {\n  func.func @main( -> ()\n}\n", 2, 19, "StableHLO text: expected non-function type"),
        ("module {\n  func.func @f() {\n    return\n  }\n}\n", 1, 1, "has no @main function"),
        (
            "module {\n  func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
            "    %0 = stablehlo.frobnicate %a : tensor<4xf32>\n    return %0 : tensor<4xf32>\n  }\n}\n",
            3,
            10,
            "custom op 'stablehlo.frobnicate' is unknown",
        ),
    ],
    ids=["syntax", "no_main", "unknown_op"],
)
def test_bad_stablehlo_text_is_a_parse_error_with_line_and_column(
    text: str, line: int, column: int, message: str
) -> None:
    with pytest.raises(HloParseError) as caught:
        parse_hlo(text, source="step.mlir")
    assert (caught.value.line, caught.value.column) == (line, column)
    assert message in str(caught.value) and "step.mlir" in str(caught.value)


def test_without_jaxlib_the_error_says_what_to_hand_over_instead() -> None:
    # A service installed without the verify extra: jax cannot be imported.
    script = (
        "import sys; sys.modules['jax'] = None\n"
        "from planner import parse_hlo\n"
        "from planner.errors import HloParseError\n"
        f"try:\n    parse_hlo(open({str(FIXTURE)!r}).read())\n"
        "except HloParseError as e:\n    print(e.line, e.column, e)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("1 1 ") and "lowered.as_text(dialect='hlo')" in done.stdout


def test_the_service_plans_stablehlo_text(tmp_path: Path) -> None:
    client = TestClient(create_app(Settings(db_path=tmp_path / "plans.sqlite3")))
    response = client.post("/plan", json={"hlo": TEXT, "chip": "v6e"})
    assert response.status_code == 200, response.text
    assert response.json()["plan"]["hbm"]["total_before"] > 0
    bad = client.post("/plan", json={"hlo": "module {\n  func.func @main( -> ()\n}\n"})
    assert bad.status_code == 422 and (bad.json()["line"], bad.json()["column"]) == (2, 19)

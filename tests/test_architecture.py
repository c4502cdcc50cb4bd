"""The layering contract (`[tool.importlinter]` in pyproject.toml) holds, and breaks on an import against it.

`lint-imports` reads the import graph of the project's packages; `make lint` runs it. Here it runs on the
tree as it is, then on a copy with one import added against a rule, once per kind of rule: the engine reaching
into the service, the algebra into the IR, one propagation engine into the other, a room of HLO or planning
into the one above it, the client library into the service.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

PACKAGES = ("planner", "cli", "api", "scan_runtime", "fidelity")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_the_tree_keeps_every_contract() -> None:
    done = lint_imports(REPO)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "6 kept, 0 broken" in done.stdout


@pytest.mark.parametrize(
    "module,bad_import,broken",
    [
        # The engine reaching into the service breaks both the apps' layers and the engine's own prohibition.
        ("planner/memory/report.py", "import api.store", ["Apps over the client library", "The engine imports no app"]),
        ("planner/sharding/algebra.py", "import planner.hlo.ir.module", ["The engine's packages"]),
        ("planner/propagation/shardy/rule.py", "import planner.propagation.gspmd.driver", ["Two propagation engines"]),
        ("planner/hlo/ir/shapes.py", "import planner.hlo.text.parser", ["HLO's rooms"]),
        ("planner/plan/diagnosis/findings.py", "import planner.plan.fixes.placements", ["Planning's rooms"]),
        ("scan_runtime/client.py", "import api.models", ["Apps over the client library"]),
    ],
    ids=[
        "engine-to-service",
        "algebra-to-ir",
        "shardy-to-gspmd",
        "ir-to-text",
        "diagnosis-to-fixes",
        "client-to-service",
    ],
)
def test_an_import_against_a_rule_breaks_its_contract(
    tmp_path: Path, module: str, bad_import: str, broken: list[str]
) -> None:
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{bad_import}  # against the layering\n")
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    # One line a contract: `NAME KEPT` or `NAME BROKEN`, with `(N ignored import)` after it where the
    # contract names an exception.
    verdicts = dict(re.findall(r"^(.+?) (KEPT|BROKEN)(?: \(\d+ ignored imports?\))?$", done.stdout, re.MULTILINE))
    assert len(verdicts) == 6, done.stdout[-2000:]
    got = sorted(name for name, verdict in verdicts.items() if verdict == "BROKEN")
    assert got == sorted(next(n for n in verdicts if n.startswith(prefix)) for prefix in broken), done.stdout[-2000:]
    # The report names the import, where it is.
    assert f"{module.removesuffix('.py').replace('/', '.')} -> {bad_import.split()[1]}" in done.stdout
